package audit

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestNewLabelsChecksKeysValuesAndCount(t *testing.T) {
	l, err := NewLabels(map[string]string{"task": "T-12", "model": "m <&>", "a.b_c-9": ""})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a.b_c-9":"","model":"m <&>","task":"T-12"}`; string(l) != want {
		t.Errorf("labels %s, want %s (sorted, compact, unescaped)", l, want)
	}
	if v, ok := l.Get("task"); !ok || v != "T-12" {
		t.Errorf("Get(task) = %q, %v", v, ok)
	}
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for name, m := range map[string]map[string]string{
		"upper-case key":    {"Task": "x"},
		"space in key":      {"my task": "x"},
		"empty key":         {"": "x"},
		"long key":          {strings.Repeat("k", MaxLabelKeyLen+1): "x"},
		"long value":        {"k": strings.Repeat("v", MaxLabelValueLen+1)},
		"control character": {"k": "a\nb"},
		"not UTF-8":         {"k": "\xff"},
		"too many":          many,
	} {
		if _, err := NewLabels(m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if l, err := NewLabels(nil); err != nil || l != "" {
		t.Errorf("no labels: %q, %v", l, err)
	}
}

// Every line of a labelled run carries its labels: the header, each record
// (one with labels of its own keeps them), and the log reads them back.
func TestARunsLabelsAreOnEveryLine(t *testing.T) {
	labels, err := NewLabels(map[string]string{"task": "T-12", "model": "m"})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := NewLabels(map[string]string{"pod": "web-1"})
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	h := fixedHeader("")
	h.Labels = labels
	w, err := Open(Options{Path: path, Header: h})
	if err != nil {
		t.Fatal(err)
	}
	recs := fixedRecords()
	recs[1].Labels = own
	for _, r := range recs {
		w.Write(r)
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var headers []Header
	i := 0
	for r, err := range RecordsWithHeaders(f, func(h Header) { headers = append(headers, h) }) {
		if err != nil {
			t.Fatal(err)
		}
		want := labels
		if i == 1 {
			want = own
		}
		if r.Labels != want {
			t.Errorf("record %d has labels %q, want %q", i, r.Labels, want)
		}
		i++
	}
	if i != len(recs) || len(headers) != 1 || headers[0].Labels != labels {
		t.Errorf("%d records (want %d), headers %+v", i, len(recs), headers)
	}
	b, _ := os.ReadFile(path)
	if n := strings.Count(string(b), `"labels":`); n != len(recs)+2 {
		t.Errorf("%d lines carry labels, want %d (header, records and trailer)", n, len(recs)+2)
	}
	if res, err := Verify(strings.NewReader(string(b))); err != nil || !res.Complete {
		t.Errorf("the labelled log does not verify: %+v %v", res, err)
	}
}

// A summary by a label groups the runs that carry each value.
func TestSummarizeByALabelGroupsTheRunsOfEachValue(t *testing.T) {
	var log []byte
	for i, task := range []string{"T-1", "T-2", "T-1"} {
		h := fixedHeader("run" + strconv.Itoa(i))
		l, err := NewLabels(map[string]string{"task": task})
		if err != nil {
			t.Fatal(err)
		}
		h.Labels = l
		recs := fixedRecords()
		for j := range recs {
			recs[j].Labels = l
		}
		log = append(log, buildLogAfter(t, log, h, recs, true)...)
	}
	var out strings.Builder
	if err := SummarizeBy(strings.NewReader(string(log)), &out, "task"); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"task       T-1\nruns       run0, run2\n", "task       T-2\nruns       run1\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("the summary by task lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "(none)") || strings.Contains(s, "trailer    missing") {
		t.Errorf("a line fell outside its task, or a trailer was missed:\n%s", s)
	}
	out.Reset()
	if err := Summarize(strings.NewReader(string(log)), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "labels     task=T-2\n") {
		t.Errorf("the summary by run does not show its labels:\n%s", out.String())
	}
}
