package dnsintercept

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxHostsFileSize bounds the hosts file read; a larger file is not used
// (names are then resolved by DNS alone).
const maxHostsFileSize = 4 << 20

// hostsRecheck is how often the hosts file is stat'ed for changes.
const hostsRecheck = time.Second

// hostsFile is a hosts(5) file read as glibc's "files" source reads it,
// before DNS: each line is an address and the names it has. It is re-read
// when it changes (checked at most once per hostsRecheck).
type hostsFile struct {
	path string

	mu      sync.Mutex
	checked time.Time
	stamp   fileStamp
	byName  map[string][]netip.Addr
	bad     bool // the last read failed: read again at the next check
}

type fileStamp struct {
	ino, size int64
	mtime     time.Time
}

// lookup returns the addresses the file gives name (normalized), IPv4
// first, and whether it has any.
func (h *hostsFile) lookup(name string) ([]netip.Addr, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if now := time.Now(); h.checked.IsZero() || now.Sub(h.checked) >= hostsRecheck {
		h.checked = now
		h.reloadLocked()
	}
	a, ok := h.byName[name]
	return slices.Clone(a), ok
}

func (h *hostsFile) reloadLocked() {
	fi, err := os.Stat(h.path)
	if err != nil {
		// No hosts file (or none readable): DNS alone, as glibc.
		h.byName, h.stamp, h.bad = nil, fileStamp{}, !errors.Is(err, os.ErrNotExist)
		return
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(s.Ino)
	}
	if st == h.stamp && !h.bad {
		return
	}
	f, err := os.Open(h.path)
	if err != nil {
		h.byName, h.stamp, h.bad = nil, fileStamp{}, true
		return
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxHostsFileSize+1))
	if err != nil || len(b) > maxHostsFileSize {
		// Unreadable, or too large to hold: DNS alone.
		h.byName, h.stamp, h.bad = nil, fileStamp{}, true
		return
	}
	h.byName, h.stamp, h.bad = parseHosts(b), st, false
}

// parseHosts reads a hosts(5) file: "ADDRESS NAME [ALIAS...]" per line,
// '#' starts a comment. Lines whose address does not parse are skipped, as
// are names that are not valid hostnames. Each name's addresses are kept
// in file order, IPv4 before IPv6, without repeats.
func parseHosts(b []byte) map[string][]netip.Addr {
	m := map[string][]netip.Addr{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxHostsFileSize)
	for sc.Scan() {
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) < 2 {
			continue
		}
		addr, err := netip.ParseAddr(fields[0])
		if err != nil || addr.Zone() != "" {
			continue
		}
		addr = addr.Unmap()
		for _, n := range fields[1:] {
			n = normalizeName(n)
			if !validHostname(n) || slices.Contains(m[n], addr) {
				continue
			}
			m[n] = append(m[n], addr)
		}
	}
	for n, as := range m {
		slices.SortStableFunc(as, func(a, b netip.Addr) int {
			switch {
			case a.Is4() == b.Is4():
				return 0
			case a.Is4():
				return -1
			}
			return 1
		})
		m[n] = as
	}
	return m
}
