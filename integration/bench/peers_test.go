package bench

// The policy-enforcing peers of issue 25, measured on the same rows as
// tunwall: sing-box's TUN inbound with a domain policy (its gvisor and its
// system stack), the seed article's recipe (tinyproxy as an allowlisting
// CONNECT proxy, the agent's uid fenced so that only the proxy is
// reachable), and tun2socks where its module can be had.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
	"github.com/tunwall/tunwall/tun"

	"golang.org/x/sys/unix"
)

// singBoxVersion is the sing-box the bench builds (issue 25 names it).
const singBoxVersion = "v1.14.1"

// singBoxBinary returns a sing-box built with -tags with_gvisor: from the
// user's cache dir when an earlier run built it, else built now in a
// temporary module (never in this repository) and cached.
func singBoxBinary() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "tunwall-bench", "sing-box-"+singBoxVersion+"-with_gvisor")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "tunwall-bench-sing-box-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	for _, argv := range [][]string{
		{"go", "mod", "init", "x"},
		{"go", "get", "github.com/sagernet/sing-box/cmd/sing-box@" + singBoxVersion},
		{"go", "build", "-trimpath", "-tags", "with_gvisor", "-o", filepath.Join(tmp, "sing-box"), "github.com/sagernet/sing-box/cmd/sing-box"},
	} {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("%s: %v: %s", strings.Join(argv[:2], " "), err, lastLine(string(out)))
		}
	}
	// Into the cache by a rename within its folder, so that a run
	// interrupted mid-copy leaves no half binary under the final name.
	part := bin + ".part"
	if err := copyFile(filepath.Join(tmp, "sing-box"), part); err != nil {
		return "", err
	}
	return bin, os.Rename(part, bin)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// benchNames are the names the world's test policy allows (tunwall's
// bench policy: allowed.test passed through, www.allowed.test).
var benchNames = []string{"allowed.test", "www.allowed.test"}

// singBoxConfig is sing-box's configuration for one run: a TUN inbound in
// the sandbox's namespace (netns), whose address and default route the
// sandbox sets itself (auto_route off); the echo host allowed by address
// like tunwall's cidr rule; every other flow sniffed, DNS answered by
// sing-box's DNS module (from the world's resolver, denied names refused),
// the allowed names sent direct, the rest rejected.
func singBoxConfig(stack, netns string) ([]byte, error) {
	cfg := map[string]any{
		"log": map[string]any{"level": "warn"},
		"dns": map[string]any{
			"servers": []any{map[string]any{"type": "udp", "tag": "world", "server": testworld.DNS4.String()}},
			"rules":   []any{map[string]any{"domain": benchNames, "invert": true, "action": "reject"}},
		},
		"inbounds": []any{map[string]any{
			"type": "tun", "tag": "tun-in", "interface_name": "tun0", "netns": netns,
			"address": []string{"172.19.0.1/30"}, "mtu": tun.DefaultMTU,
			"auto_route": false, "dns_mode": "disabled", "stack": stack,
		}},
		"outbounds": []any{map[string]any{"type": "direct", "tag": "direct"}},
		"route": map[string]any{
			"rules": []any{
				map[string]any{"ip_cidr": []string{testworld.Echo4.String() + "/32"}, "outbound": "direct"},
				map[string]any{"action": "sniff"},
				map[string]any{"protocol": "dns", "action": "hijack-dns"},
				map[string]any{"domain": benchNames, "outbound": "direct"},
				map[string]any{"ip_cidr": []string{"0.0.0.0/0", "::/0"}, "action": "reject"},
			},
			"final": "direct",
		},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// singBox runs argv in a fresh network namespace whose only interface is
// sing-box's TUN; sing-box itself runs in the agent namespace (its direct
// outbound leaves by the agent's veth, as tunwall's sockets do).
func (e *env) singBox(stack string) func(ctx context.Context, argv []string) (string, procStats, error) {
	run := e.singBoxRun(stack)
	return func(ctx context.Context, argv []string) (string, procStats, error) {
		if e.singBoxErr != nil {
			return "", procStats{}, e.singBoxErr
		}
		// Once per world: the policy holds (a connection to an address
		// no rule allows reaches nothing), else the column would
		// measure an open network.
		if key := e.w.ID + stack; e.policyChecked != key {
			e.w.ResetArrivals()
			out, _, err := run(ctx, []string{filepath.Join(e.bin, "twload"), "cps", "-addr", testworld.Evil4.String() + ":80", "-n", "1"})
			if err != nil {
				return out, procStats{}, fmt.Errorf("sing-box policy probe: %w", err)
			}
			if a := e.w.Arrivals("evil"); len(a) > 0 {
				return out, procStats{}, fmt.Errorf("sing-box's policy let a connection to %v through: %+v", testworld.Evil4, a[0])
			}
			e.policyChecked = key
		}
		return run(ctx, argv)
	}
}

func (e *env) singBoxRun(stack string) func(ctx context.Context, argv []string) (string, procStats, error) {
	return func(ctx context.Context, argv []string) (string, procStats, error) {
		ready := filepath.Join(e.bin, fmt.Sprintf("sing-box-ready-%d", time.Now().UnixNano()))
		defer os.Remove(ready)
		// Bounded waits: 10 s for sing-box's TUN and its address, 10 s
		// for the go.
		script := fmt.Sprintf(`ip link set lo up
i=0; until ip route add default dev tun0 2>/dev/null; do i=$((i+1)); [ $i -gt 1000 ] && { echo no tun0 >&2; exit 97; }; sleep 0.01; done
i=0; until [ -e %s ]; do i=$((i+1)); [ $i -gt 1000 ] && exit 99; sleep 0.01; done
exec "$@"`, ready)
		cmd := e.w.AgentCommand(ctx, "unshare", append([]string{"--net", "sh", "-c", script, "sh"}, argv...)...)
		cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+e.worldCA)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			return "", procStats{}, err
		}
		defer func() {
			cmd.Process.Kill()
			cmd.Wait()
		}()
		// The namespace exists once ip and unshare have exec'd sh.
		if err := waitFor(5*time.Second, func() bool {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
			return strings.TrimSpace(string(b)) == "sh"
		}); err != nil {
			return "", procStats{}, fmt.Errorf("sandbox namespace: %w", err)
		}
		cfg, err := singBoxConfig(stack, fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
		if err != nil {
			return "", procStats{}, err
		}
		cfgPath := filepath.Join(e.bin, "sing-box-"+stack+".json")
		if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
			return "", procStats{}, err
		}
		sb := e.w.AgentCommand(ctx, e.singBoxBin, "run", "-c", cfgPath, "-D", e.bin, "--disable-color")
		var sbErr strings.Builder
		sb.Stdout, sb.Stderr = &sbErr, &sbErr
		if err := sb.Start(); err != nil {
			return "", procStats{}, err
		}
		defer func() {
			sb.Process.Kill()
			sb.Wait()
		}()
		s := sample(sb.Process.Pid)
		// sing-box starts its stack with the TUN; the sandbox goes once
		// its route through the TUN is set and a connection through
		// sing-box to the echo host succeeds.
		if err := waitFor(10*time.Second, func() bool { return tunUp(cmd.Process.Pid) }); err != nil {
			s.finish()
			return errb.String() + sbErr.String(), procStats{}, fmt.Errorf("sing-box's TUN: %w", err)
		}
		echo := net.JoinHostPort(testworld.Echo4.String(), "80")
		if err := waitFor(10*time.Second, func() bool { return dialsIn(cmd.Process.Pid, echo) }); err != nil {
			s.finish()
			return errb.String() + sbErr.String(), procStats{}, fmt.Errorf("a connection through sing-box to %s: %w", echo, err)
		}
		os.WriteFile(ready, nil, 0o644)
		err = cmd.Wait()
		st := s.finish()
		if err != nil {
			return out.String() + errb.String() + sbErr.String(), st, err
		}
		return out.String(), st, nil
	}
}

// tunUp reports whether the namespace of pid has its default route
// through tun0 (read from /proc/PID/net, which is that namespace's).
func tunUp(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/route", pid))
	return err == nil && strings.Contains(string(b), "tun0\t00000000\t")
}

// dialsIn reports whether a TCP connection to addr, made in the network
// namespace of pid, succeeds within a second.
func dialsIn(pid int, addr string) bool {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	ok := make(chan bool, 1)
	go func() {
		// Never unlocked: the thread is retired with the goroutine, and
		// nothing else ever runs in that namespace by accident.
		runtime.LockOSThread()
		if unix.Setns(fd, unix.CLONE_NEWNET) != nil {
			ok <- false
			return
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		ok <- err == nil
	}()
	return <-ok
}

// waitFor polls cond every 10 ms for at most d.
func waitFor(d time.Duration, cond func() bool) error {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return nil
		}
	}
	return fmt.Errorf("not within %v", d)
}

// tinyproxyPort is where the recipe's proxy listens, on the agent
// namespace's loopback.
const tinyproxyPort = 8888

// agentUID is the uid the recipe's agent runs as (nobody); the fence lets
// it reach loopback only.
const agentUID = 65534

// tinyproxySetup writes the recipe's files into e.bin and fences agentUID
// in the current world's agent namespace (once per world): packets from
// its sockets may go to loopback only, IPv4 and IPv6.
func (e *env) tinyproxySetup() error {
	if e.fenced == e.w.ID {
		return nil
	}
	var allow strings.Builder
	for _, n := range append(benchNames, testworld.Echo4.String()) {
		fmt.Fprintf(&allow, "^%s$\n", strings.ReplaceAll(n, ".", `\.`))
	}
	files := map[string]string{
		"tinyproxy.allow": allow.String(),
		"resolv.conf":     "nameserver " + testworld.DNS4.String() + "\n",
		// The seed article's configuration, but for the log (errors
		// only: the article's Connect level writes a line a connection),
		// MaxClients (the hold rows open 10,000) and the ports of the
		// world's echo and request/response servers.
		"tinyproxy.conf": fmt.Sprintf(`User tinyproxy
Group tinyproxy
Port %d
Listen 127.0.0.1
Timeout 600
LogLevel Error
MaxClients 12000
Allow 127.0.0.1
DisableViaHeader Yes
Filter "%s"
FilterType ere
FilterURLs Off
FilterDefaultDeny Yes
ConnectPort 443
ConnectPort 7
ConnectPort 80
ConnectPort 81
ConnectPort 82
`, tinyproxyPort, filepath.Join(e.bin, "tinyproxy.allow")),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(e.bin, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	uid := strconv.Itoa(agentUID)
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for _, rule := range [][]string{
			{"-A", "OUTPUT", "-m", "owner", "--uid-owner", uid, "-o", "lo", "-j", "ACCEPT"},
			{"-A", "OUTPUT", "-m", "owner", "--uid-owner", uid, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
			{"-A", "OUTPUT", "-m", "owner", "--uid-owner", uid, "-j", "REJECT"},
		} {
			if out, err := e.w.AgentCommand(context.Background(), ipt, rule...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s %s: %v: %s", ipt, strings.Join(rule, " "), err, out)
			}
		}
	}
	// The fence holds: the agent's direct connection to the echo host
	// fails (else the recipe's column would measure an open network).
	probe := e.w.AgentCommand(context.Background(), "setpriv", "--reuid="+uid, "--regid="+uid, "--clear-groups", "--",
		filepath.Join(e.bin, "twload"), "cps", "-addr", testworld.Echo4.String()+":80", "-n", "1")
	out, err := probe.Output()
	if r := parseLoad(string(out)); err != nil || r.Failed != 1 {
		return fmt.Errorf("the fence let the agent's uid connect past the proxy (%v): %s", err, out)
	}
	e.fenced = e.w.ID
	return nil
}

// tinyproxy runs argv as the fenced agent uid with a fresh tinyproxy
// serving it; twload's TCP goes through the proxy (-proxy).
func (e *env) tinyproxy(ctx context.Context, argv []string) (string, procStats, error) {
	if err := e.tinyproxySetup(); err != nil {
		return "", procStats{}, err
	}
	// The proxy resolves names with the world's resolver: ip netns exec
	// gives each command a mount namespace of its own, so the bind
	// mount is the proxy's alone.
	px := e.w.AgentCommand(ctx, "sh", "-c", `mount --bind "$1" /etc/resolv.conf && exec tinyproxy -d -c "$2"`, "sh",
		filepath.Join(e.bin, "resolv.conf"), filepath.Join(e.bin, "tinyproxy.conf"))
	var pxErr strings.Builder
	px.Stdout, px.Stderr = &pxErr, &pxErr
	if err := px.Start(); err != nil {
		return "", procStats{}, err
	}
	defer func() {
		px.Process.Kill()
		px.Wait()
	}()
	addr := fmt.Sprintf("127.0.0.1:%d", tinyproxyPort)
	if err := waitFor(10*time.Second, func() bool {
		ok := false
		e.w.InAgent(func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
				ok = true
			}
			return nil
		})
		return ok
	}); err != nil {
		return pxErr.String(), procStats{}, fmt.Errorf("tinyproxy: %w", err)
	}
	if filepath.Base(argv[0]) == "twload" && len(argv) > 1 {
		argv = append([]string{argv[0], argv[1], "-proxy", addr}, argv[2:]...)
	}
	args := []string{"--reuid=" + strconv.Itoa(agentUID), "--regid=" + strconv.Itoa(agentUID), "--clear-groups", "--"}
	cmd := e.w.AgentCommand(ctx, "setpriv", append(args, argv...)...)
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+e.worldCA)
	s := sample(px.Process.Pid)
	out, _, err := runSampled(cmd, nil)
	st := s.finish()
	if err != nil {
		out += pxErr.String()
	}
	return out, st, err
}

// tun2socksModule is xjasonlyu/tun2socks, the peer issue 25 names.
const tun2socksModule = "github.com/xjasonlyu/tun2socks/v2"

// tun2socksMissing asks the module proxy once whether tun2socks can be
// had here and says why its column has no figures: this bench has no
// tun2socks path yet (docs/performance.md says how to add one), and where
// the module is not served it cannot have one.
func tun2socksMissing() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-m", tun2socksModule+"@latest")
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := lastLine(string(out))
		if strings.Contains(string(out), "403") || strings.Contains(string(out), "not available") {
			return errors.New("module not served (go list -m " + tun2socksModule + "@latest: 403)")
		}
		return fmt.Errorf("go list -m %s@latest: %v: %s", tun2socksModule, err, msg)
	}
	return fmt.Errorf("module served (%s), but this bench has no tun2socks path yet", strings.TrimSpace(string(out)))
}
