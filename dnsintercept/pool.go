package dnsintercept

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
)

// Default fake-address prefixes. 198.18.0.0/15 is reserved for benchmarking
// (RFC 2544) and not routed on the Internet; fd74:756e:7761:6c6d::/64 is a
// ULA prefix (fd00::/8) whose next seven bytes spell "tunwalm" in ASCII.
var (
	DefaultPrefix4 = netip.MustParsePrefix("198.18.0.0/15")
	DefaultPrefix6 = netip.MustParsePrefix("fd74:756e:7761:6c6d::/64")
)

// DefaultReserved is how many addresses at the start of each prefix NewPool
// keeps for tunwall's own infrastructure (198.18.0.0/24 and
// fd74:756e:7761:6c6d::/120 with the default prefixes, e.g. the virtual
// resolver 198.18.0.1 and fd74:756e:7761:6c6d::1). They are never handed out.
const DefaultReserved = 256

// ErrPoolExhausted is returned by Pool.Assign when every slot is taken. Slots
// are never recycled, so the pool stays exhausted for the rest of its life.
var ErrPoolExhausted = errors.New("dnsintercept: fake address pool exhausted")

// Pool hands out fake addresses: slot n is the n-th unreserved address of the
// IPv4 prefix and the n-th unreserved address of the IPv6 prefix, so a name's
// A and AAAA answers share a slot. A name keeps its slot for the pool's whole
// life; slots are never recycled.
//
// A Pool is safe for concurrent use.
type Pool struct {
	v4, v6   netip.Prefix
	base4    uint32 // first address of v4 as an integer
	base6hi  uint64 // first address of v6 as a 128-bit integer
	base6lo  uint64
	reserved uint32 // addresses skipped at the start of each prefix
	capacity uint32 // number of slots: min of the free v4 and free v6 counts

	mu    sync.RWMutex
	slots map[string]uint32 // name -> slot
	names []string          // slot -> name; len(names) is the next free slot
}

// NewPool returns a pool over v4 and v6 that keeps the first DefaultReserved
// addresses of each prefix for tunwall's own use. v4 must be a masked IPv4
// prefix of length /8 to /24 and v6 a masked IPv6 prefix of length /48 to
// /120; since 256 addresses are reserved, a /24 or /120 leaves no slots and is
// rejected too.
func NewPool(v4, v6 netip.Prefix) (*Pool, error) {
	return NewPoolReserved(v4, v6, DefaultReserved)
}

// NewPoolReserved is NewPool with a caller-chosen number of reserved
// addresses at the start of each prefix (0 reserves none). It errors when the
// prefixes are invalid or when reserved leaves no free slot in either prefix.
func NewPoolReserved(v4, v6 netip.Prefix, reserved int) (*Pool, error) {
	if !v4.IsValid() || !v4.Addr().Is4() || v4.Bits() < 8 || v4.Bits() > 24 {
		return nil, fmt.Errorf("dnsintercept: IPv4 pool %v: want an IPv4 prefix of length /8 to /24", v4)
	}
	if v4.Masked() != v4 {
		return nil, fmt.Errorf("dnsintercept: IPv4 pool %v has host bits set (did you mean %v?)", v4, v4.Masked())
	}
	if !v6.IsValid() || !v6.Addr().Is6() || v6.Addr().Is4In6() || v6.Bits() < 48 || v6.Bits() > 120 {
		return nil, fmt.Errorf("dnsintercept: IPv6 pool %v: want an IPv6 prefix of length /48 to /120", v6)
	}
	if v6.Masked() != v6 {
		return nil, fmt.Errorf("dnsintercept: IPv6 pool %v has host bits set (did you mean %v?)", v6, v6.Masked())
	}
	if v6.Addr().Zone() != "" {
		return nil, fmt.Errorf("dnsintercept: IPv6 pool %v must not have a zone", v6)
	}
	if reserved < 0 {
		return nil, fmt.Errorf("dnsintercept: reserved address count %d is negative", reserved)
	}
	size4 := uint64(1) << (32 - v4.Bits())
	size6 := uint64(math.MaxUint32)
	if hostBits := 128 - v6.Bits(); hostBits < 32 {
		size6 = uint64(1) << hostBits
	}
	free := min(size4, size6)
	if uint64(reserved) >= free {
		return nil, fmt.Errorf("dnsintercept: pools %v and %v leave no free address after reserving %d", v4, v6, reserved)
	}
	free -= uint64(reserved)

	a4 := v4.Addr().As4()
	a6 := v6.Addr().As16()
	return &Pool{
		v4:       v4,
		v6:       v6,
		base4:    binary.BigEndian.Uint32(a4[:]),
		base6hi:  binary.BigEndian.Uint64(a6[:8]),
		base6lo:  binary.BigEndian.Uint64(a6[8:]),
		reserved: uint32(reserved),
		capacity: uint32(free),
		slots:    make(map[string]uint32),
	}, nil
}

// Assign returns the fake addresses of name, allocating the next free slot
// the first time name is seen. name is normalized first (ASCII lower-case, one
// trailing dot removed), so "Example.COM." and "example.com" share a slot. It
// returns ErrPoolExhausted when name has no slot and none is left.
func (p *Pool) Assign(name string) (v4, v6 netip.Addr, err error) {
	name = normalizeName(name)
	if name == "" {
		return netip.Addr{}, netip.Addr{}, errors.New("dnsintercept: cannot assign a fake address to the root name")
	}
	p.mu.RLock()
	slot, ok := p.slots[name]
	p.mu.RUnlock()
	if !ok {
		p.mu.Lock()
		slot, ok = p.slots[name]
		if !ok {
			if uint64(len(p.names)) >= uint64(p.capacity) {
				p.mu.Unlock()
				return netip.Addr{}, netip.Addr{}, ErrPoolExhausted
			}
			slot = uint32(len(p.names))
			p.names = append(p.names, name)
			p.slots[name] = slot
		}
		p.mu.Unlock()
	}
	v4, v6 = p.addrs(slot)
	return v4, v6, nil
}

// addrs returns the addresses of slot.
func (p *Pool) addrs(slot uint32) (v4, v6 netip.Addr) {
	off := uint64(p.reserved) + uint64(slot)
	var a4 [4]byte
	binary.BigEndian.PutUint32(a4[:], p.base4+uint32(off))
	lo := p.base6lo + off
	hi := p.base6hi
	if lo < p.base6lo { // carry; cannot happen for /64 and longer, can for /48
		hi++
	}
	var a6 [16]byte
	binary.BigEndian.PutUint64(a6[:8], hi)
	binary.BigEndian.PutUint64(a6[8:], lo)
	return netip.AddrFrom4(a4), netip.AddrFrom16(a6)
}

// Name returns the name whose slot holds ip, which may be a fake IPv4 address,
// a fake IPv6 address or an IPv4-mapped IPv6 form (::ffff:198.18.1.2) of a
// fake IPv4 address. It reports false for reserved, unassigned and foreign
// addresses. It does not allocate.
func (p *Pool) Name(ip netip.Addr) (string, bool) {
	off, ok := p.offset(ip)
	if !ok || off < uint64(p.reserved) {
		return "", false
	}
	slot := off - uint64(p.reserved)
	p.mu.RLock()
	defer p.mu.RUnlock()
	if slot >= uint64(len(p.names)) {
		return "", false
	}
	return p.names[slot], true
}

// offset returns ip's distance from the start of the pool prefix that
// contains it.
func (p *Pool) offset(ip netip.Addr) (uint64, bool) {
	ip = ip.Unmap().WithZone("")
	switch {
	case ip.Is4():
		if !p.v4.Contains(ip) {
			return 0, false
		}
		a := ip.As4()
		return uint64(binary.BigEndian.Uint32(a[:]) - p.base4), true
	case ip.Is6():
		if !p.v6.Contains(ip) {
			return 0, false
		}
		a := ip.As16()
		hi, lo := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
		dlo := lo - p.base6lo
		if lo < p.base6lo { // borrow
			hi--
		}
		if hi != p.base6hi || dlo > math.MaxUint32 {
			return 0, false // farther than any slot can be
		}
		return dlo, true
	}
	return 0, false
}

// Contains reports whether ip (or the IPv4 address an IPv4-mapped ip embeds)
// lies in either pool prefix, reserved part included.
func (p *Pool) Contains(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	return p.v4.Contains(ip) || p.v6.Contains(ip)
}

// Prefixes returns the IPv4 and IPv6 prefixes the pool draws from.
func (p *Pool) Prefixes() (v4, v6 netip.Prefix) { return p.v4, p.v6 }

// Len returns the number of names that hold a slot.
func (p *Pool) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.names)
}

// Cap returns the total number of slots, taken or free.
func (p *Pool) Cap() int { return int(p.capacity) }
