package sandbox

import (
	"github.com/tunwall/tunwall/internal/testenv"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A newer bubblewrap's --help (0.10/0.11 options), and one that grew an
// option joining another network namespace.
const newerBwrapHelp = `usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]

    --help                       Print this help
    --version                    Print version
    --level-prefix               Prepend e.g. <3> to diagnostic messages
    --ro-bind SRC DEST           Bind mount the host path SRC readonly on DEST
    --overlay-src SRC            Read files from SRC in the following overlay
    --overlay RWSRC WORKDIR DEST Mount overlayfs on DEST, with RWSRC as the host path for writes and
                                 WORKDIR an empty directory on the same filesystem as RWSRC
    --tmp-overlay DEST           Mount overlayfs on DEST, with a temporary directory for writes
    --ro-overlay DEST            Mount overlayfs read-only on DEST
    --netns FD                   Use this network namespace
    --utsns FD                   Use this uts namespace
    --bind-net-thing SRC         something with net in its name
`

func TestBwrapOptionsOfANewerBwrapPassThrough(t *testing.T) {
	saved := installedBwrapArity
	t.Cleanup(func() { installedBwrapArity = saved })
	arity := parseBwrapHelp(newerBwrapHelp)
	installedBwrapArity = func() map[string]int { return arity }
	for opt, n := range map[string]int{"--level-prefix": 0, "--overlay-src": 1, "--overlay": 3, "--tmp-overlay": 1, "--ro-overlay": 1} {
		if got, ok := arity[opt]; !ok || got != n {
			t.Errorf("%s: arity %d (listed %v), want %d", opt, got, ok, n)
		}
	}
	if _, ok := arity["--help"]; ok {
		t.Error("--help is not an option to pass")
	}
	user := []string{"--level-prefix", "--ro-bind", "/", "/", "--overlay-src", "/usr", "--tmp-overlay", "/usr",
		"--overlay-src", "/a", "--overlay", "/rw", "/work", "/b", "--ro-overlay", "/c", "--", "true"}
	args, _, err := bwrapArgs(user, "/r")
	if err != nil {
		t.Fatalf("bwrapArgs: %v", err)
	}
	if !slices.Contains(args, "--tmp-overlay") || !slices.Contains(args, "--level-prefix") || args[len(args)-1] != "true" ||
		!strings.Contains(strings.Join(args, " "), "--overlay-src /a --overlay /rw /work /b --ro-overlay /c ") {
		t.Errorf("bwrapArgs passed %q", args)
	}
	// Options that would join another namespace are refused, known or new.
	for _, opt := range [][]string{{"--netns", "5"}, {"--utsns", "5"}, {"--bind-net-thing", "/x"}, {"--userns", "5"}, {"--pidns", "5"}, {"--userns2", "5"}} {
		_, _, err := bwrapArgs(append(opt, "--", "true"), "/r")
		if err == nil || !strings.Contains(err.Error(), "cannot be used with tunwall bwrap") {
			t.Errorf("bwrapArgs(%q): %v, want a refusal", opt, err)
		}
	}
	// An option neither table lists is refused (its arguments are unknown).
	if _, _, err := bwrapArgs([]string{"--from-the-future", "x", "--", "true"}, "/r"); err == nil {
		t.Error("an unknown option was accepted")
	}
}

func TestBwrapDescriptorsCannotBeANetwork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := conn.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	itoa := func(f *os.File) string { return fdString(f.Fd()) }
	for _, c := range []struct {
		opt  []string
		want string
	}{
		{[]string{"--sync-fd", itoa(f)}, "network socket"},
		{[]string{"--info-fd", itoa(f)}, "network socket"},
		{[]string{"--file", itoa(f), "/x"}, "network socket"},
		{[]string{"--bind-fd", itoa(ns), "/x"}, "a namespace"},
		{[]string{"--sync-fd", itoa(r)}, ""},
	} {
		err := CheckBwrapArgs(append(c.opt, "--", "true"))
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CheckBwrapArgs(%q) = %v, want %q", c.opt, err, c.want)
		}
	}
}

func fdString(fd uintptr) string { return strconv.Itoa(int(fd)) }

// TestInstalledBwrapHelpAgreesWithTheTable reads the real bwrap's --help
// the way tunwall does: every option of the built-in table it lists must
// have the same number of arguments.
func TestInstalledBwrapHelpAgreesWithTheTable(t *testing.T) {
	got := installedBwrapArity()
	if got == nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bwrap is not installed")
		}
		testenv.Skip(t, "bwrap is not installed")
	}
	if len(got) < 40 {
		t.Fatalf("read %d options from bwrap --help", len(got))
	}
	for opt, n := range bwrapArity {
		if m, ok := got[opt]; ok && m != n {
			t.Errorf("%s: --help says %d arguments, the table %d", opt, m, n)
		}
	}
}
