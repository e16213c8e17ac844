package audit

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// TestAWriterOnAPipeWritesAChainThatVerifies: Options.File, as a node
// agent's --audit-stdout gives it (a pipe it reads whole lines from): no
// lock, no preallocation, no fsync (which a pipe refuses), and the lines
// still form a chain that verifies.
func TestAWriterOnAPipeWritesAChainThatVerifies(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(r); got <- b }()
	labels, _ := NewLabels(map[string]string{"k8s_pod": "pod-a"})
	wr, err := Open(Options{Path: "<stdout>", File: w, Header: Header{Phase: "exec", Labels: labels}, SyncEvery: 10e6})
	if err != nil {
		t.Fatalf("Open on a pipe: %v", err)
	}
	wr.Write(Record{Kind: KindFlow, Verdict: VerdictAllow, Host: "a.test", Proto: "tcp"})
	sum, err := wr.Close()
	if err != nil || sum.Lost != 0 {
		t.Fatalf("Close: %+v %v", sum, err)
	}
	b := <-got
	res, err := Verify(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the pipe's lines do not verify: %v\n%s", err, b)
	}
	if res.Lines != 3 || !bytes.Contains(b, []byte(`"k8s_pod":"pod-a"`)) {
		t.Errorf("%+v\n%s", res, b)
	}
}
