package sandbox

import (
	"strings"
	"testing"
)

func TestForeignProcMountsAreEveryProcfsButOursAtProc(t *testing.T) {
	const mountinfo = `22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
23 22 0:22 / /proc/sys/fs/binfmt_misc rw,relatime shared:13 - autofs systemd-1 rw
30 1 0:25 / /sys rw,nosuid shared:7 - sysfs sysfs rw
41 1 0:21 / /host\040proc rw,relatime - proc proc rw
42 1 0:21 / /srv/ctr/proc rw,relatime - proc proc rw
43 1 0:21 / /srv/ctr/proc rw,relatime - proc proc rw
50 22 0:40 / /proc rw,nosuid,nodev,noexec - proc proc rw
51 50 0:40 /sys /proc/sys ro,nosuid,nodev,noexec - proc proc rw
60 1 0:41 / /mnt/x rw - tmpfs proc rw
`
	got, err := parseForeignProcMounts(strings.NewReader(mountinfo))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/host proc", "/srv/ctr/proc"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`:   "/a b",
		`/tab\011`:  "/tab\t",
		`/back\134`: `/back\`,
		`/short\04`: `/short\04`,
		`/plain`:    "/plain",
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHostIDsNeverRoot(t *testing.T) {
	for _, c := range []struct {
		uid, gid     string
		wantU, wantG int
	}{
		{"1000", "1000", 1000, 1000},
		{"", "", nobodyID, nobodyID},
		{"0", "0", nobodyID, nobodyID},
		{"1000", "0", nobodyID, nobodyID},
		{"-5", "7", nobodyID, nobodyID},
		{"x", "1000", nobodyID, nobodyID},
		{"4294967295", "1000", nobodyID, nobodyID},
	} {
		t.Setenv("SUDO_UID", c.uid)
		t.Setenv("SUDO_GID", c.gid)
		if u, g := hostIDs(); u != c.wantU || g != c.wantG {
			t.Errorf("SUDO_UID=%q SUDO_GID=%q: got %d:%d, want %d:%d", c.uid, c.gid, u, g, c.wantU, c.wantG)
		}
	}
}
