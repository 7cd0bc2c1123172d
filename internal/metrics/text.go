package metrics

import (
	"bufio"
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// ContentType is the media type of the text exposition format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// WriteText writes fams in the text exposition format 0.0.4: per family a
// HELP and a TYPE line, then its samples (histograms as _bucket with le,
// _sum and _count; summaries with quantile, _sum and _count).
func WriteText(w io.Writer, fams []Family) error {
	bw := bufio.NewWriter(w)
	var b []byte
	for _, f := range fams {
		b = b[:0]
		b = append(b, "# HELP "...)
		b = append(b, f.Name...)
		b = append(b, ' ')
		b = appendEscaped(b, f.Help, false)
		b = append(b, "\n# TYPE "...)
		b = append(b, f.Name...)
		b = append(b, ' ')
		b = append(b, f.Type...)
		b = append(b, '\n')
		for _, s := range f.Series {
			switch f.Type {
			case TypeHistogram:
				for _, bk := range s.Buckets {
					b = appendSample(b, f.Name, "_bucket", s.Labels, "le", bk.Upper, float64(bk.Count))
				}
				b = appendSample(b, f.Name, "_sum", s.Labels, "", 0, s.Sum)
				b = appendSample(b, f.Name, "_count", s.Labels, "", 0, float64(s.Count))
			case TypeSummary:
				for _, q := range s.Quantiles {
					b = appendSample(b, f.Name, "", s.Labels, "quantile", q.Q, q.Value)
				}
				b = appendSample(b, f.Name, "_sum", s.Labels, "", 0, s.Sum)
				b = appendSample(b, f.Name, "_count", s.Labels, "", 0, float64(s.Count))
			default:
				b = appendSample(b, f.Name, "", s.Labels, "", 0, s.Value)
			}
		}
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// appendSample appends one sample line: name+suffix, the labels (and the
// extra label, if named, with a float value), the value.
func appendSample(b []byte, name, suffix string, labels []Label, extra string, extraV, v float64) []byte {
	b = append(b, name...)
	b = append(b, suffix...)
	if len(labels) > 0 || extra != "" {
		b = append(b, '{')
		for i, l := range labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, l.Name...)
			b = append(b, `="`...)
			b = appendEscaped(b, l.Value, true)
			b = append(b, '"')
		}
		if extra != "" {
			if len(labels) > 0 {
				b = append(b, ',')
			}
			b = append(b, extra...)
			b = append(b, `="`...)
			b = appendFloat(b, extraV)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = appendFloat(b, v)
	return append(b, '\n')
}

// appendEscaped appends s with backslash and line feed escaped (and, in a
// label value, the double quote), invalid UTF-8 replaced by U+FFFD.
func appendEscaped(b []byte, s string, quote bool) []byte {
	s = strings.ToValidUTF8(s, "\uFFFD")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendFloat appends v as the exposition format writes numbers.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// Handler serves r's families in the text format, gzipped when the client
// accepts it. Only GET and HEAD are allowed.
func Handler(r *Registry) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		fams := r.Gather()
		w.Header().Set("Content-Type", ContentType)
		if req.Method == http.MethodHead {
			return
		}
		if acceptsGzip(req.Header.Get("Accept-Encoding")) {
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Add("Vary", "Accept-Encoding")
			zw := gzip.NewWriter(w)
			if WriteText(zw, fams) == nil {
				zw.Close()
			}
			return
		}
		WriteText(w, fams)
	})
}

// acceptsGzip reports whether an Accept-Encoding value allows gzip.
func acceptsGzip(ae string) bool {
	for part := range strings.SplitSeq(ae, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			continue
		}
		params = strings.ReplaceAll(params, " ", "")
		return !strings.HasPrefix(params, "q=0") || strings.Trim(strings.TrimPrefix(params, "q="), "0.") != ""
	}
	return false
}
