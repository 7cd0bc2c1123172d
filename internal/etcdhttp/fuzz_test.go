package etcdhttp

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// Gateway answers as etcd writes them (proto names, int64 as strings,
// base64 bytes, enums by name, zero values omitted).
var gatewaySeeds = []string{
	`{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"7","raft_term":"2"},"kvs":[{"key":"L2t2L2E=","create_revision":"2","mod_revision":"5","version":"2","value":"Mg=="}],"count":"1"}`,
	`{"header":{"revision":"9"},"succeeded":true,"responses":[{"response_range":{"header":{"revision":"9"},"kvs":[{"key":"YQ==","value":"MQ==","lease":"7587888888"}],"count":"1"}},{"response_put":{"header":{}}},{"response_txn":{"header":{},"succeeded":true,"responses":[{"response_delete_range":{"header":{},"deleted":"3"}}]}}]}`,
	`{"result":{"header":{"revision":"4"},"watch_id":"0","created":true}}` + "\n" + `{"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"L3cvYQ==","create_revision":"5","mod_revision":"5","version":"1","value":"MQ=="}},{"type":"DELETE","kv":{"key":"L3cvYQ==","mod_revision":"6"}}]}}` + "\n",
	`{"result":{"header":{"revision":"8"},"canceled":true,"compact_revision":"8"}}`,
	`{"error":{"code":11,"message":"etcdserver: mvcc: required revision has been compacted","details":[]}}`,
	`{"result":{"header":{"revision":"3"},"ID":"7587888888","TTL":"2"}}`,
	`{"code":14,"message":"etcdserver: no leader"}`,
	`{"header":{"revision":"x"}}`, `{"kvs":[{"key":"!!"}]}`, `{"result":null}`, `[]`, `"`, ``,
}

func FuzzDecode(f *testing.F) {
	for _, s := range gatewaySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip[RangeResponse](t, data)
		roundTrip[TxnResponse](t, data)
		roundTrip[LeaseGrantResponse](t, data)
		roundTrip[Error](t, data)
		// A stream: frames until an error; never a panic or a loop.
		dec := json.NewDecoder(bytes.NewReader(data))
		for range 1000 {
			w, err := decodeFrame[WatchResponse](dec)
			if err != nil {
				break
			}
			if w == nil {
				t.Fatal("decodeFrame returned neither a result nor an error")
			}
		}
		if strings.Contains(string(data), `"error"`) {
			return
		}
		var e Error
		_ = json.Unmarshal(data, &e)
		_ = e.Error()
		_ = IsCompacted(&e)
	})
}

// roundTrip decodes data as T and, if that worked, checks that encoding
// and decoding again gives the same value.
func roundTrip[T any](t *testing.T, data []byte) {
	t.Helper()
	var v T
	if json.Unmarshal(data, &v) != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("re-encode %T: %v", v, err)
	}
	var w T
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatalf("decode re-encoded %T %s: %v", v, b, err)
	}
	if !reflect.DeepEqual(normalize(v), normalize(w)) {
		t.Fatalf("%T round trip: %+v != %+v", v, v, w)
	}
}

// normalize maps empty slices to nil (omitempty drops them).
func normalize(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestDecodeSeeds(t *testing.T) {
	var r RangeResponse
	if err := json.Unmarshal([]byte(gatewaySeeds[0]), &r); err != nil {
		t.Fatal(err)
	}
	if r.Header.Revision != 7 || r.Header.ClusterID != 14841639068965178418 || len(r.Kvs) != 1 || string(r.Kvs[0].Key) != "/kv/a" || string(r.Kvs[0].Value) != "2" || r.Kvs[0].ModRevision != 5 || r.Count != 1 {
		t.Errorf("range answer decoded as %+v", r)
	}
	var tx TxnResponse
	if err := json.Unmarshal([]byte(gatewaySeeds[1]), &tx); err != nil {
		t.Fatal(err)
	}
	if !tx.Succeeded || len(tx.Responses) != 3 || tx.Responses[0].Range.Kvs[0].Lease != 7587888888 || tx.Responses[1].Put == nil || tx.Responses[2].Txn.Responses[0].DeleteRange.Deleted != 3 {
		t.Errorf("txn answer decoded as %+v", tx)
	}
	dec := json.NewDecoder(strings.NewReader(gatewaySeeds[2]))
	w1, err := decodeFrame[WatchResponse](dec)
	if err != nil || !w1.Created {
		t.Fatalf("first frame = %+v, %v; want created", w1, err)
	}
	w2, err := decodeFrame[WatchResponse](dec)
	if err != nil || len(w2.Events) != 2 || w2.Events[0].IsDelete() || !w2.Events[1].IsDelete() || string(w2.Events[0].Kv.Value) != "1" {
		t.Fatalf("second frame = %+v, %v; want a put and a delete", w2, err)
	}
	if _, err := decodeFrame[WatchResponse](json.NewDecoder(strings.NewReader(gatewaySeeds[4]))); !IsCompacted(err) {
		t.Errorf("error frame = %v; want compacted", err)
	}
	if _, err := decodeFrame[WatchResponse](json.NewDecoder(strings.NewReader(`{}`))); err == nil {
		t.Error("empty frame decoded without error")
	}
}
