package etcdhttp

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
)

// ResponseHeader is etcd's response header.
type ResponseHeader struct {
	ClusterID uint64 `json:"cluster_id,string,omitempty"`
	MemberID  uint64 `json:"member_id,string,omitempty"`
	Revision  int64  `json:"revision,string,omitempty"`
	RaftTerm  uint64 `json:"raft_term,string,omitempty"`
}

// KeyValue is a stored key.
type KeyValue struct {
	Key            []byte `json:"key,omitempty"`
	CreateRevision int64  `json:"create_revision,string,omitempty"`
	ModRevision    int64  `json:"mod_revision,string,omitempty"`
	Version        int64  `json:"version,string,omitempty"`
	Value          []byte `json:"value,omitempty"`
	Lease          int64  `json:"lease,string,omitempty"`
}

// Sort orders and targets of a RangeRequest.
const (
	SortAscend  = "ASCEND"
	SortDescend = "DESCEND"

	SortByKey    = "KEY"
	SortByCreate = "CREATE"
	SortByMod    = "MOD"
)

// RangeRequest reads the key Key, or the keys in [Key, RangeEnd).
type RangeRequest struct {
	Key               []byte `json:"key,omitempty"`
	RangeEnd          []byte `json:"range_end,omitempty"`
	Limit             int64  `json:"limit,string,omitempty"`
	Revision          int64  `json:"revision,string,omitempty"`
	SortOrder         string `json:"sort_order,omitempty"`
	SortTarget        string `json:"sort_target,omitempty"`
	Serializable      bool   `json:"serializable,omitempty"`
	KeysOnly          bool   `json:"keys_only,omitempty"`
	CountOnly         bool   `json:"count_only,omitempty"`
	MinCreateRevision int64  `json:"min_create_revision,string,omitempty"`
	MaxCreateRevision int64  `json:"max_create_revision,string,omitempty"`
}

// RangeResponse answers a RangeRequest.
type RangeResponse struct {
	Header ResponseHeader `json:"header"`
	Kvs    []KeyValue     `json:"kvs,omitempty"`
	More   bool           `json:"more,omitempty"`
	Count  int64          `json:"count,string,omitempty"`
}

// PutRequest writes Key.
type PutRequest struct {
	Key    []byte `json:"key,omitempty"`
	Value  []byte `json:"value,omitempty"`
	Lease  int64  `json:"lease,string,omitempty"`
	PrevKV bool   `json:"prev_kv,omitempty"`
}

// PutResponse answers a PutRequest.
type PutResponse struct {
	Header ResponseHeader `json:"header"`
	PrevKV *KeyValue      `json:"prev_kv,omitempty"`
}

// DeleteRangeRequest deletes the key Key, or the keys in [Key, RangeEnd).
type DeleteRangeRequest struct {
	Key      []byte `json:"key,omitempty"`
	RangeEnd []byte `json:"range_end,omitempty"`
	PrevKV   bool   `json:"prev_kv,omitempty"`
}

// DeleteRangeResponse answers a DeleteRangeRequest.
type DeleteRangeResponse struct {
	Header  ResponseHeader `json:"header"`
	Deleted int64          `json:"deleted,string,omitempty"`
	PrevKvs []KeyValue     `json:"prev_kvs,omitempty"`
}

// Compare results and targets.
const (
	Equal    = "EQUAL"
	Greater  = "GREATER"
	Less     = "LESS"
	NotEqual = "NOT_EQUAL"

	TargetVersion = "VERSION"
	TargetCreate  = "CREATE"
	TargetMod     = "MOD"
	TargetValue   = "VALUE"
	TargetLease   = "LEASE"
)

// Compare is one condition of a transaction: Target of Key compared
// (Result) with Number (version, revision or lease) or, for TargetValue,
// with Value.
type Compare struct {
	Result string
	Target string
	Key    []byte
	Number int64
	Value  []byte
}

// CmpCreate compares the create revision of key (0: the key does not exist).
func CmpCreate(key, result string, rev int64) Compare {
	return Compare{Result: result, Target: TargetCreate, Key: []byte(key), Number: rev}
}

// CmpMod compares the modification revision of key.
func CmpMod(key, result string, rev int64) Compare {
	return Compare{Result: result, Target: TargetMod, Key: []byte(key), Number: rev}
}

// CmpValue compares the value of key (bytewise).
func CmpValue(key, result, value string) Compare {
	return Compare{Result: result, Target: TargetValue, Key: []byte(key), Value: []byte(value)}
}

// MarshalJSON writes the gateway's form, whose compared field depends on
// the target.
func (c Compare) MarshalJSON() ([]byte, error) {
	m := map[string]any{"result": c.Result, "target": c.Target, "key": c.Key}
	n := strconv.FormatInt(c.Number, 10)
	switch c.Target {
	case TargetVersion:
		m["version"] = n
	case TargetCreate:
		m["create_revision"] = n
	case TargetMod:
		m["mod_revision"] = n
	case TargetLease:
		m["lease"] = n
	case TargetValue:
		m["value"] = c.Value
	default:
		return nil, fmt.Errorf("etcdhttp: compare target %q", c.Target)
	}
	switch c.Result {
	case Equal, Greater, Less, NotEqual:
	default:
		return nil, fmt.Errorf("etcdhttp: compare result %q", c.Result)
	}
	return json.Marshal(m)
}

// RequestOp is one operation of a transaction (exactly one field set).
type RequestOp struct {
	Range       *RangeRequest       `json:"request_range,omitempty"`
	Put         *PutRequest         `json:"request_put,omitempty"`
	DeleteRange *DeleteRangeRequest `json:"request_delete_range,omitempty"`
	Txn         *TxnRequest         `json:"request_txn,omitempty"`
}

// ResponseOp answers a RequestOp (the field of the request's kind is set).
type ResponseOp struct {
	Range       *RangeResponse       `json:"response_range,omitempty"`
	Put         *PutResponse         `json:"response_put,omitempty"`
	DeleteRange *DeleteRangeResponse `json:"response_delete_range,omitempty"`
	Txn         *TxnResponse         `json:"response_txn,omitempty"`
}

// OpGet reads key.
func OpGet(key string) RequestOp { return RequestOp{Range: &RangeRequest{Key: []byte(key)}} }

// OpPut writes key.
func OpPut(key, value string) RequestOp {
	return RequestOp{Put: &PutRequest{Key: []byte(key), Value: []byte(value)}}
}

// OpDelete deletes key.
func OpDelete(key string) RequestOp {
	return RequestOp{DeleteRange: &DeleteRangeRequest{Key: []byte(key)}}
}

// OpDeletePrefix deletes every key starting with prefix.
func OpDeletePrefix(prefix string) RequestOp {
	return RequestOp{DeleteRange: &DeleteRangeRequest{Key: []byte(prefix), RangeEnd: PrefixEnd([]byte(prefix))}}
}

// OpTxn nests a transaction.
func OpTxn(cmp []Compare, then, els []RequestOp) RequestOp {
	return RequestOp{Txn: &TxnRequest{Compare: cmp, Success: then, Failure: els}}
}

// TxnRequest runs Success if every Compare holds, else Failure, atomically.
type TxnRequest struct {
	Compare []Compare   `json:"compare,omitempty"`
	Success []RequestOp `json:"success,omitempty"`
	Failure []RequestOp `json:"failure,omitempty"`
}

// TxnResponse answers a TxnRequest; Responses answer the branch that ran.
type TxnResponse struct {
	Header    ResponseHeader `json:"header"`
	Succeeded bool           `json:"succeeded,omitempty"`
	Responses []ResponseOp   `json:"responses,omitempty"`
}

// PrefixEnd returns the range end that covers every key starting with
// prefix (etcd's convention: "\x00" for the whole key space).
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}

// Range reads keys.
func (c *Client) Range(ctx context.Context, r RangeRequest) (*RangeResponse, error) {
	var out RangeResponse
	if err := c.call(ctx, "/v3/kv/range", r, &out, true); err != nil {
		return nil, err
	}
	return &out, nil
}

// Get reads one key.
func (c *Client) Get(ctx context.Context, key string) (*RangeResponse, error) {
	return c.Range(ctx, RangeRequest{Key: []byte(key)})
}

// GetPrefix reads every key starting with prefix, sorted by key.
func (c *Client) GetPrefix(ctx context.Context, prefix string, keysOnly bool) (*RangeResponse, error) {
	return c.Range(ctx, RangeRequest{Key: []byte(prefix), RangeEnd: PrefixEnd([]byte(prefix)), KeysOnly: keysOnly, SortOrder: SortAscend, SortTarget: SortByKey})
}

// Put writes key (with lease, if not 0).
func (c *Client) Put(ctx context.Context, key, value string, lease int64) (*PutResponse, error) {
	var out PutResponse
	if err := c.call(ctx, "/v3/kv/put", PutRequest{Key: []byte(key), Value: []byte(value), Lease: lease}, &out, true); err != nil {
		return nil, err
	}
	return &out, nil
}

// Delete deletes keys.
func (c *Client) Delete(ctx context.Context, r DeleteRangeRequest) (*DeleteRangeResponse, error) {
	var out DeleteRangeResponse
	if err := c.call(ctx, "/v3/kv/deleterange", r, &out, true); err != nil {
		return nil, err
	}
	return &out, nil
}

// Txn runs a transaction. It is sent again to another endpoint only if it
// could not be sent at all (its compares may no longer hold after a retry).
func (c *Client) Txn(ctx context.Context, t TxnRequest) (*TxnResponse, error) {
	var out TxnResponse
	if err := c.call(ctx, "/v3/kv/txn", t, &out, isReadOnly(t)); err != nil {
		return nil, err
	}
	return &out, nil
}

func isReadOnly(t TxnRequest) bool {
	for _, ops := range [][]RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if op.Range == nil && (op.Txn == nil || !isReadOnly(*op.Txn)) {
				return false
			}
		}
	}
	return true
}

// Compact drops the history before rev.
func (c *Client) Compact(ctx context.Context, rev int64) error {
	var out struct {
		Header ResponseHeader `json:"header"`
	}
	in := struct {
		Revision int64 `json:"revision,string"`
	}{rev}
	return c.call(ctx, "/v3/kv/compaction", in, &out, true)
}
