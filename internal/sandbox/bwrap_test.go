package sandbox

import (
	"fmt"
	"strings"
	"testing"
)

func TestBwrapArgs(t *testing.T) {
	const resolv = "9"
	ours := []string{"--die-with-parent", "--unshare-pid"}
	tail := func(cmd ...string) []string {
		return append([]string{"--perms", "0444", "--ro-bind-data", resolv, "/etc/resolv.conf", "--"}, cmd...)
	}
	join := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name    string
		user    []string
		want    []string
		wantFDs []int
		wantErr string
	}{
		{"options then -- then the command keep their order, with ours first and resolv.conf bound last",
			[]string{"--ro-bind", "/", "/", "--dev", "/dev", "--", "npm", "test"},
			join(ours, []string{"--ro-bind", "/", "/", "--dev", "/dev"}, tail("npm", "test")), nil, ""},
		{"the command may follow the options without --",
			[]string{"--proc", "/proc", "sh", "-c", "echo --bind"},
			join(ours, []string{"--proc", "/proc"}, tail("sh", "-c", "echo --bind")), nil, ""},
		{"two-argument options consume both arguments",
			[]string{"--setenv", "A", "--unshare-net", "--", "env"},
			join(ours, []string{"--setenv", "A", "--unshare-net"}, tail("env")), nil, ""},
		{"the user's --unshare-pid is not doubled",
			[]string{"--unshare-pid", "true"},
			join([]string{"--die-with-parent", "--unshare-pid"}, tail("true")), nil, ""},
		{"--unshare-net and --share-net are dropped: bwrap runs in the TUN-only namespace",
			[]string{"--unshare-net", "--share-net", "true"},
			join(ours, tail("true")), nil, ""},
		{"--unshare-all becomes every namespace but the network",
			[]string{"--unshare-all", "true"},
			join([]string{"--die-with-parent", "--unshare-user-try", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"}, tail("true")), nil, ""},
		{"--uid of any id is kept: bwrap maps it in its own user namespace",
			[]string{"--uid", "0", "true"},
			join(ours, []string{"--uid", "0"}, tail("true")), nil, ""},
		{"descriptors named by options are returned once, stdio left out",
			[]string{"--seccomp", "9", "--file", "11", "/etc/x", "--ro-bind-data", "9", "/etc/y", "--info-fd", "2", "true"},
			join(ours, []string{"--seccomp", "9", "--file", "11", "/etc/x", "--ro-bind-data", "9", "/etc/y", "--info-fd", "2"}, tail("true")), []int{9, 11}, ""},
		{"a descriptor that is not a number is refused", []string{"--seccomp", "x", "true"}, nil, nil, "not a descriptor"},
		{"--userns is refused", []string{"--userns", "9", "true"}, nil, nil, "--userns"},
		{"--pidns is refused", []string{"--pidns", "9", "true"}, nil, nil, "--pidns"},
		{"--args is refused", []string{"--args", "9"}, nil, nil, "--args"},
		{"an unknown option is refused by name", []string{"--frobnicate", "true"}, nil, nil, "unknown bwrap option --frobnicate"},
		{"a missing option argument is refused", []string{"--bind", "/a"}, nil, nil, "needs 2 argument"},
		{"no command is refused", []string{"--dev", "/dev"}, nil, nil, "no command"},
		{"an empty command after -- is refused", []string{"--dev", "/dev", "--"}, nil, nil, "no command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, fds, err := bwrapArgs(tt.user, resolv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "\x00") != strings.Join(tt.want, "\x00") {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
			if fmt.Sprint(fds) != fmt.Sprint(tt.wantFDs) && !(len(fds) == 0 && len(tt.wantFDs) == 0) {
				t.Fatalf("fds %v, want %v", fds, tt.wantFDs)
			}
		})
	}
}

func FuzzBwrapArgs(f *testing.F) {
	f.Add("--ro-bind\x00/\x00/\x00--\x00sh")
	f.Add("--unshare-all\x00--share-net\x00true")
	f.Add("--setenv\x00--unshare-net\x00x\x00--unshare-net\x00true")
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		got, _, err := bwrapArgs(args, "7")
		if err != nil {
			return
		}
		// Whatever the user passed, bwrap never leaves the TUN-only network
		// namespace or joins another namespace, the sandbox always has its
		// own pid namespace, and resolv.conf is ours.
		if got[0] != "--die-with-parent" {
			t.Fatalf("tunwall's options are not first: %q", got)
		}
		joined := "\x00" + strings.Join(got, "\x00") + "\x00"
		if !strings.Contains(joined, "\x00--perms\x000444\x00--ro-bind-data\x007\x00/etc/resolv.conf\x00--\x00") {
			t.Fatalf("resolv.conf is not bound before the command: %q", got)
		}
		pidns := false
		for j := 0; j < len(got); {
			if got[j] == "--" {
				break
			}
			switch got[j] {
			case "--share-net", "--unshare-net", "--unshare-all", "--args", "--userns", "--userns2", "--pidns":
				t.Fatalf("option %s passed to bwrap: %q", got[j], got)
			case "--unshare-pid":
				pidns = true
			}
			n, ok := bwrapArity[got[j]]
			if !ok {
				t.Fatalf("bwrap would see %q as the command before tunwall's options end: %q", got[j], got)
			}
			j += 1 + n
		}
		if !pidns {
			t.Fatalf("no --unshare-pid: %q", got)
		}
	})
}
