package sandbox

import (
	"strings"
	"testing"
)

func TestBwrapArgs(t *testing.T) {
	const resolv = "/tmp/r/resolv.conf"
	ours := []string{"--unshare-net", "--die-with-parent", "--userns", "5", "--info-fd", "3", "--block-fd", "4"}
	tail := func(cmd ...string) []string {
		return append([]string{"--ro-bind", resolv, "/etc/resolv.conf", "--"}, cmd...)
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
		uid     int
		want    []string
		wantErr string
	}{
		{"options then -- then the command keep their order, with ours first and resolv.conf bound last",
			[]string{"--ro-bind", "/", "/", "--dev", "/dev", "--", "npm", "test"}, 1000,
			join(ours, []string{"--ro-bind", "/", "/", "--dev", "/dev"}, tail("npm", "test")), ""},
		{"the command may follow the options without --",
			[]string{"--proc", "/proc", "sh", "-c", "echo --bind"}, 1000,
			join(ours, []string{"--proc", "/proc"}, tail("sh", "-c", "echo --bind")), ""},
		{"two-argument options consume both arguments",
			[]string{"--setenv", "A", "--not-an-option", "--", "env"}, 1000,
			join(ours, []string{"--setenv", "A", "--not-an-option"}, tail("env")), ""},
		{"--unshare-user is dropped: tunwall provides the user namespace",
			[]string{"--unshare-user", "--unshare-user-try", "true"}, 1000,
			join(ours, tail("true")), ""},
		{"--unshare-all becomes every namespace but the user one",
			[]string{"--unshare-all", "true"}, 1000,
			join(ours, []string{"--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"}, tail("true")), ""},
		{"--uid of one's own id is kept when rootless",
			[]string{"--uid", "1000", "true"}, 1000,
			join(ours, []string{"--uid", "1000"}, tail("true")), ""},
		{"--uid of another id is refused when rootless", []string{"--uid", "0", "true"}, 1000, nil, "maps only your own id"},
		{"--share-net is refused", []string{"--unshare-all", "--share-net", "true"}, 0, nil, "--share-net"},
		{"--userns is refused", []string{"--userns", "9", "true"}, 0, nil, "--userns"},
		{"--info-fd is refused", []string{"--info-fd", "9", "true"}, 0, nil, "--info-fd"},
		{"--args is refused", []string{"--args", "9"}, 0, nil, "--args"},
		{"an unknown option is refused by name", []string{"--frobnicate", "true"}, 0, nil, "unknown bwrap option --frobnicate"},
		{"a missing option argument is refused", []string{"--bind", "/a"}, 0, nil, "needs 2 argument"},
		{"no command is refused", []string{"--dev", "/dev"}, 0, nil, "no command"},
		{"an empty command after -- is refused", []string{"--dev", "/dev", "--"}, 0, nil, "no command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := bwrapArgs(tt.user, resolv, tt.uid, tt.uid)
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
		})
	}
}

func FuzzBwrapArgs(f *testing.F) {
	f.Add("--ro-bind\x00/\x00/\x00--\x00sh")
	f.Add("--unshare-all\x00--share-net\x00true")
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		got, err := bwrapArgs(args, "/r", 1000, 1000)
		if err != nil {
			return
		}
		// Whatever the user passed, the sandbox never shares the network,
		// never gets another user namespace, and resolv.conf is ours.
		joined := "\x00" + strings.Join(got, "\x00") + "\x00"
		if strings.Contains(joined, "\x00--share-net\x00") && !strings.Contains(joined, "\x00--\x00") {
			t.Fatalf("--share-net passed through: %q", got)
		}
		if got[0] != "--unshare-net" || got[3] != "5" {
			t.Fatalf("tunwall's options are not first: %q", got)
		}
		i := strings.Index(joined, "\x00--ro-bind\x00/r\x00/etc/resolv.conf\x00--\x00")
		if i < 0 {
			t.Fatalf("resolv.conf is not bound before the command: %q", got)
		}
		// Walk the options as bwrap will.
		for j := 0; j < len(got); {
			if got[j] == "--" {
				break
			}
			switch got[j] {
			case "--share-net", "--unshare-user", "--unshare-user-try", "--args", "--userns2":
				t.Fatalf("option %s passed to bwrap: %q", got[j], got)
			}
			n, ok := bwrapArity[got[j]]
			if !ok {
				t.Fatalf("bwrap would see %q as the command before tunwall's options end: %q", got[j], got)
			}
			j += 1 + n
		}
	})
}
