package audit

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// recordJSON is how lines were encoded before appendLine: encoding/json on
// flowLine. appendLine must write the same bytes.
func recordJSON(r *Record, prev [32]byte) []byte {
	l := flowLine{TS: r.TS.UTC().Format(tsLayout), recordFields: recordFields(*r), Prev: hex.EncodeToString(prev[:])}
	if d := l.DurationMS; math.IsNaN(d) || math.IsInf(d, 0) {
		l.DurationMS = -1
	}
	if !r.Until.IsZero() {
		l.Until = r.Until.UTC().Format(tsLayout)
	}
	l.Count = max(l.Count, 0)
	if r.Labels != "" {
		l.Labels = json.RawMessage(r.Labels)
	}
	for _, s := range r.Samples {
		if s != "" {
			l.Samples = append(l.Samples, s)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&l); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

func TestAppendLineIsJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"", "a", "pypi.org", "é", "日本", "<>&", `"`, `\`, "\x00", "\x01", "\x1f", "\x7f",
		"\b", "\f", "\n", "\r", "\t", "\u2028", "\u2029", "\xff", "\xe2\x80", "\xed\xa0\x80", "\U0001F600", " ", "%", "/"}
	str := func() string {
		var s string
		for range rng.IntN(5) {
			s += pieces[rng.IntN(len(pieces))]
		}
		return s
	}
	addrs := []netip.AddrPort{{}, netip.MustParseAddrPort("198.51.100.2:40000"), netip.MustParseAddrPort("[2001:db8::7]:443"),
		netip.MustParseAddrPort("[::ffff:1.2.3.4]:0"), netip.AddrPortFrom(netip.MustParseAddr("fe80::1%e\"t\\h0"), 65535),
		netip.AddrPortFrom(netip.Addr{}, 80)}
	floats := []float64{0, 1520.5, 0.2, -1, 1e-7, 1.5e-7, 1e21, 123456789.125, math.NaN(), math.Inf(1), math.Inf(-1), -0.0000001, 3.0000000000000004, 1e20}
	ints := []int{0, 1, -1, 7, 1 << 40, -(1 << 40)}
	times := []time.Time{{}, t0, time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.FixedZone("x", 3600)), time.Unix(0, 1)}
	var prev [32]byte
	for i := range 20000 {
		r := Record{
			TS: times[rng.IntN(len(times))], Run: str(), Phase: str(), Kind: str(), Proto: str(),
			Src: addrs[rng.IntN(len(addrs))], Dst: addrs[rng.IntN(len(addrs))], Host: str(), HostFrom: str(),
			Port: uint16(rng.IntN(65536)), Verdict: str(), Rule: str(), Reason: str(), PID: ints[rng.IntN(len(ints))],
			Comm: str(), Exe: str(), Owner: str(), BytesOut: int64(ints[rng.IntN(len(ints))]), BytesIn: rng.Int64(),
			DurationMS: floats[rng.IntN(len(floats))], Dial: addrs[rng.IntN(len(addrs))],
			DialFailed: str(), SNI: str(), HTTPHost: str(), Qname: str(), Qtype: str(), Rcode: str(), Outcome: str(),
			Method: str(), Path: str(), Status: ints[rng.IntN(len(ints))], Secrets: str(), Count: ints[rng.IntN(len(ints))],
			Until: times[rng.IntN(len(times))], Prev: str(),
		}
		for j := range rng.IntN(MaxSamples + 1) {
			r.Samples[j] = str()
		}
		if i%2 == 0 {
			l, err := NewLabels(map[string]string{"task": str(), "model": str()})
			if err == nil {
				r.Labels = l
			}
		}
		if i%3 == 0 {
			r.DurationMS = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(50)-25))
		}
		for j := range prev {
			prev[j] = byte(rng.Uint32())
		}
		want := recordJSON(&r, prev)
		got := appendLine(nil, &r, &prev)
		if !bytes.Equal(got, want) {
			t.Fatalf("record %+v:\n got %s\nwant %s", r, got, want)
		}
	}
	for _, r := range fixedRecords() {
		if got, want := appendLine(nil, &r, &prev), recordJSON(&r, prev); !bytes.Equal(got, want) {
			t.Fatalf("got %s\nwant %s", got, want)
		}
	}
}

func BenchmarkAppendLine(b *testing.B) {
	r := fixedRecords()[1]
	var prev [32]byte
	buf := make([]byte, 0, 1024)
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			buf = appendLine(buf[:0], &r, &prev)
		}
	})
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			recordJSON(&r, prev)
		}
	})
}

// TestAppendLineWritesEveryField fills every field of Record by reflection,
// so that a field added to Record (and so to encoding/json's line) and not
// to appendLine fails here, whatever its type.
func TestAppendLineWritesEveryField(t *testing.T) {
	var r Record
	v := reflect.ValueOf(&r).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Interface().(type) {
		case time.Time:
			f.Set(reflect.ValueOf(t0.Add(time.Duration(i) * time.Second)))
		case netip.AddrPort:
			f.Set(reflect.ValueOf(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(1000+i))))
		case Labels:
			f.Set(reflect.ValueOf(Labels(`{"task":"v` + strconv.Itoa(i) + `"}`)))
		case [MaxSamples]string:
			for j := range MaxSamples {
				f.Index(j).SetString("s" + strconv.Itoa(i) + "." + strconv.Itoa(j))
			}
		default:
			switch f.Kind() {
			case reflect.String:
				f.SetString("v" + strconv.Itoa(i))
			case reflect.Int, reflect.Int64:
				f.SetInt(int64(1 + i))
			case reflect.Uint16:
				f.SetUint(uint64(1 + i))
			case reflect.Float64:
				f.SetFloat(float64(i) + 0.5)
			default:
				t.Fatalf("Record.%s has type %s, which this test (and appendLine?) does not know", v.Type().Field(i).Name, f.Type())
			}
		}
	}
	var prev [32]byte
	if got, want := appendLine(nil, &r, &prev), recordJSON(&r, prev); !bytes.Equal(got, want) {
		t.Fatalf("appendLine and encoding/json differ on a record with every field set:\n got %s\nwant %s", got, want)
	}
}
