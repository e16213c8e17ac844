// Package integration runs tunwall end to end with real clients (curl,
// python3, node, dig, ping, bwrap) in the isolated test world of
// ARCHITECTURE.md: an agent network namespace where tunwall runs, a world
// namespace of logging servers on 192.0.2.0/24 and 2001:db8::/32, a veth
// between them, and no route anywhere else. No packet leaves the machine.
//
//	agent netns (tunwall runs here)              world netns
//	┌──────────────────────────────┐   veth   ┌──────────────────────────────┐
//	│ tunwall ── sandbox (TUN only) │ 10.77.0.1│ web 192.0.2.10/11 :80 :443   │
//	│ 127.0.0.1:8081 agent-lo log   │──────────│ dns 192.0.2.53 (query log)   │
//	│ 10.77.0.1:8081 agent-veth log │ 10.77.0.2│ echo 192.0.2.20 :7 :9 :19 :80│
//	│ routes: 192.0.2/24, 2001:db8::/32,       │ evil 192.0.2.66 (arrival log)│
//	│   169.254.169.254, 10.0.0.5 -> veth      │ 169.254.169.254, 10.0.0.5 log│
//	└──────────────────────────────┘          └──────────────────────────────┘
//
// The tests need root (CI runs them as root). Elsewhere they skip loudly.
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// tunwallBin is the binary under test, built once by TestMain into a
// directory every user can read (the rootless tests run it as nobody).
var tunwallBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tunwall-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	tunwallBin = filepath.Join(dir, "tunwall")
	args := []string{"build", "-o", tunwallBin}
	race := os.Getenv(raceEnv) == "1"
	var raceDir string
	if race {
		// Every tunwall the tests start writes its race reports here
		// (GORACE log_path, one file per process); any file fails the run,
		// whatever the test made of the process's exit status.
		raceDir = filepath.Join(dir, "race")
		if err := os.Mkdir(raceDir, 0o1777); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		os.Chmod(raceDir, 0o1777) // the rootless tests' tunwall runs as nobody
		args = append(args, "-race")
		os.Setenv("GORACE", "log_path="+filepath.Join(raceDir, "report"))
	}
	build := exec.Command("go", append(args, "github.com/tunwall/tunwall/cmd/tunwall")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: building tunwall:", err)
		return 1
	}
	code := m.Run()
	if race {
		reports, _ := filepath.Glob(filepath.Join(raceDir, "report*"))
		for _, r := range reports {
			b, _ := os.ReadFile(r)
			fmt.Fprintf(os.Stderr, "integration: race report of the tunwall under test (%s):\n%s\n", r, b)
		}
		if len(reports) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: %d race report(s) from tunwall\n", len(reports))
			code = 1
		} else {
			fmt.Fprintln(os.Stderr, "integration: tunwall was built with -race; no race reported")
		}
	}
	return code
}

// raceEnv set to 1 builds the tunwall under test with the race detector
// (make test runs the data-path and policy tests so).
const raceEnv = "TUNWALL_TEST_RACE"
