package integration

// The audit log under faults (issue 13, "Hold under load", item 7): a disk
// that fills up while the sandbox keeps connecting, and tunwall killed with
// SIGKILL. The disk is a real 64 KiB tmpfs the test mounts (and unmounts);
// the sandbox is a real python3 making connection after connection.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// exitAuditLost is the documented exit status (README, "Exit status") of a
// run that lost audit records.
const exitAuditLost = 122

// smallDisk mounts a tmpfs of size bytes on a new directory and unmounts it
// when the test ends.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tunwall-disk-")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tunwall-test", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size+",mode=0777"); err != nil {
		os.Remove(dir)
		t.Fatalf("mount a %s tmpfs: %v", size, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir
}

// connectScript makes n connections to allowed.test:80 one after another
// (each sends a request and reads the answer), counts those that worked and
// those that did not, prints both, and exits 7.
func connectScript(n int) string {
	return fmt.Sprintf(`python3 - <<'PY'
import socket, sys
ok = bad = 0
for i in range(%d):
    try:
        s = socket.create_connection(("allowed.test", 80), timeout=5)
        s.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
        while s.recv(4096):
            pass
        s.close()
        ok += 1
    except OSError:
        bad += 1
print("ok", ok, "failed", bad)
sys.exit(7)
PY`, n)
}

func TestAFullDiskLeavesAVerifiableLogAndAnExitStatusThatSaysSo(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	disk := smallDisk(t, "64k")
	log := filepath.Join(disk, "audit.jsonl")
	r := w.run(runOpts{
		flags:   []string{"--allow", "allowed.test:80", "--audit", log},
		script:  connectScript(600),
		timeout: 3 * time.Minute,
	})
	t.Logf("%s", r)

	// The disk did fill up: the sandbox saw connections work, then fail.
	m := regexp.MustCompile(`ok (\d+) failed (\d+)`).FindStringSubmatch(r.stdout)
	if m == nil || m[1] == "0" || m[2] == "0" {
		t.Fatalf("want some connections to work and then some to be refused once the log is full, got %q", r.stdout)
	}
	st, err := os.Stat(log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("log: %d bytes on a 64 KiB disk", st.Size())

	// Only whole lines, and the chain verifies.
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		tail := b[max(0, len(b)-120):]
		t.Errorf("the log ends in a torn line: ...%q", tail)
	}
	for i, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		if !json.Valid(l) {
			t.Errorf("line %d is not a whole JSON record: %.120q", i+1, l)
		}
	}
	out, err := exec.Command(tunwallBin, "audit", "verify", log).CombinedOutput()
	if err != nil {
		t.Errorf("tunwall audit verify on the log of a full disk: %v\n%s", err, out)
	}

	// The loss is in the trailer, and said on stderr, with the command's
	// own status.
	ls := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	var tr struct {
		Kind string `json:"kind"`
		Lost int    `json:"lost"`
	}
	json.Unmarshal(ls[len(ls)-1], &tr)
	if tr.Kind != "trailer" || tr.Lost == 0 {
		t.Errorf("want a trailer counting the lost records last, got %.300q", ls[len(ls)-1])
	}
	if r.code != exitAuditLost {
		t.Errorf("tunwall exited %d after losing audit records; want %d (the command's own status was 7)", r.code, exitAuditLost)
	}
	if !strings.Contains(r.stderr, "the command exited 7") || !regexp.MustCompile(`\d+ audit records? (were|was) lost`).MatchString(r.stderr) {
		t.Errorf("stderr does not say how many records were lost and the command's status:\n%s", r.stderr)
	}
}

// tempLeftovers lists the entries of dir named tunwall-*.
func tempLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "tunwall-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSIGKILLOfTunwallLeavesNoTemporaryFiles(t *testing.T) {
	requireTools(t, "bwrap")
	w := newWorld(t)
	for _, sub := range []string{"run", "bwrap"} {
		t.Run(sub, func(t *testing.T) {
			// A private TMPDIR the sandbox's user may enter.
			tmp := filepath.Join(w.dir, "tmp-"+sub)
			if err := os.Mkdir(tmp, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(tmp, 0o777)
			o := runOpts{
				flags:  []string{"--allow", "allowed.test:80", "--quiet"},
				script: `grep -q 198.18.0.1 /etc/resolv.conf && echo ready; while :; do sleep 0.05; done`,
				env:    []string{"TMPDIR=" + tmp},
			}
			if sub == "bwrap" {
				o.bwrap = []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd, _ := w.tunwallCmd(ctx, o, sub)
			out, _ := cmd.StdoutPipe()
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("want ready (the sandbox's resolv.conf names tunwall), got %q\n%s", line, stderr.String())
			}
			if left := tempLeftovers(t, tmp); len(left) > 0 {
				t.Logf("while the sandbox runs, %s holds %v", tmp, left)
			}
			cmd.Process.Kill()
			cmd.Wait()
			// The sandbox's processes die with tunwall (pdeathsig); wait,
			// bounded, until none is left before looking.
			for i := 0; i < 100 && len(descendants(cmd.Process.Pid)) > 0; i++ {
				time.Sleep(50 * time.Millisecond)
			}
			if left := tempLeftovers(t, tmp); len(left) > 0 {
				t.Errorf("after SIGKILL of tunwall %s, left behind in TMPDIR: %v", sub, left)
			}
		})
	}
}
