package dnsintercept

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	"github.com/tunwall/tunwall/internal/netplan"
)

// Default fake-address prefixes: the address plan's (package netplan).
// 198.18.0.0/15 is reserved for benchmarking (RFC 2544) and not routed on
// the Internet; fd74:756e:7761:6c6d::/64 is a ULA prefix (fd00::/8) whose
// next seven bytes spell "tunwalm" in ASCII.
var (
	DefaultPrefix4 = netplan.Default.Fake4
	DefaultPrefix6 = netplan.Default.Fake6
)

// DefaultReserved is how many addresses at the start of each prefix NewPool
// keeps for tunwall's own infrastructure (198.18.0.0/24 and
// fd74:756e:7761:6c6d::/120 with the default prefixes; the virtual resolver
// 198.18.0.1 and the sandbox's 198.18.0.2 are in the first). They are never
// handed out.
const DefaultReserved = netplan.Reserved

// DefaultPoolSize is how many slots a Pool has when PoolOptions.Size is 0
// (fewer if the prefixes hold fewer). It bounds the name table's memory
// (a few hundred bytes a slot at most) while leaving room for far more
// names than a sandbox uses within DefaultReuseAfter.
const DefaultPoolSize = 32768

// DefaultReuseAfter is how long a slot of a name that is not pinned must go
// unused before it may go to another name, when PoolOptions.ReuseAfter is 0.
// It is ten times the TTL of the fake answers (60s), so a client that
// caches an answer for its TTL, or a few times longer, never finds its
// address handed to another name.
const DefaultReuseAfter = 10 * time.Minute

// touchEvery is how often Assign records a use of a name it has already
// seen; repeated queries within it take only the read lock.
const touchEvery = time.Second

// ErrPoolExhausted is returned by Pool.Assign when every slot is taken:
// pinned, held by a live flow, or used within the reuse time.
var ErrPoolExhausted = errors.New("dnsintercept: fake address pool exhausted")

// PoolOptions are a Pool's optional settings. The zero value gives the
// documented defaults.
type PoolOptions struct {
	// Size is the number of slots. 0 means DefaultPoolSize; either way it
	// is capped by what the prefixes hold after the reserved addresses.
	Size int
	// Pinned names (e.g. the exact names of the policy's rules) get the
	// first slots at once, in order, and keep them for the pool's whole
	// life: a flood of other names can neither take nor starve them. They
	// are normalized like Assign's argument; duplicates share a slot. More
	// pinned names than slots is an error.
	Pinned []string
	// ReuseAfter is how long a slot of a name that is not pinned must go
	// unused (no Assign, and no flow holding it: see Acquire) before Assign
	// may give it to another name, least recently used first. The old name
	// loses its addresses; asked again, it gets a new slot. 0 means
	// DefaultReuseAfter; a negative value means slots are never reused.
	ReuseAfter time.Duration
	// Now is the clock; nil means time.Now. For tests.
	Now func() time.Time
}

// Pool hands out fake addresses: slot n is the n-th unreserved address of the
// IPv4 prefix and the n-th unreserved address of the IPv6 prefix, so a name's
// A and AAAA answers share a slot. A name keeps its slot while it is used:
// pinned names for the pool's whole life, other names until their slot has
// been idle for ReuseAfter and another name needs a slot. A slot held by a
// live flow (Acquire without its Release) is never reused.
//
// A Pool is safe for concurrent use.
type Pool struct {
	v4, v6   netip.Prefix
	base4    uint32 // first address of v4 as an integer
	base6hi  uint64 // first address of v6 as a 128-bit integer
	base6lo  uint64
	reserved uint32 // addresses skipped at the start of each prefix
	capacity uint32 // number of slots
	reuse    time.Duration
	now      func() time.Time
	epoch    time.Time

	mu    sync.RWMutex
	slots map[string]uint32 // name -> slot
	table []slot            // slot -> state; len(table) is the next never-used slot
	// lru lists the slots that may be reused: not pinned and held by no
	// flow, least recently used first. head and tail are -1 when empty.
	head, tail int32
}

// slot is one entry of the table.
type slot struct {
	name       string
	last       time.Duration // since epoch: the last Assign, or the end of the last flow
	refs       int32         // live flows on the slot's addresses
	pinned     bool
	inLRU      bool
	prev, next int32 // lru links; -1 ends
}

// NewPool returns a pool over v4 and v6 that keeps the first DefaultReserved
// addresses of each prefix for tunwall's own use, with default options. v4
// must be a masked IPv4 prefix of length /8 to /24 and v6 a masked IPv6
// prefix of length /48 to /120; since 256 addresses are reserved, a /24 or
// /120 leaves no slots and is rejected too.
func NewPool(v4, v6 netip.Prefix) (*Pool, error) {
	return NewPoolWith(v4, v6, DefaultReserved, PoolOptions{})
}

// NewPoolReserved is NewPool with a caller-chosen number of reserved
// addresses at the start of each prefix (0 reserves none). It errors when the
// prefixes are invalid or when reserved leaves no free slot in either prefix.
func NewPoolReserved(v4, v6 netip.Prefix, reserved int) (*Pool, error) {
	return NewPoolWith(v4, v6, reserved, PoolOptions{})
}

// NewPoolWith is NewPoolReserved with options.
func NewPoolWith(v4, v6 netip.Prefix, reserved int, o PoolOptions) (*Pool, error) {
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
	if o.Size < 0 {
		return nil, fmt.Errorf("dnsintercept: pool size %d is negative", o.Size)
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
	size := uint64(o.Size)
	if size == 0 {
		size = DefaultPoolSize
	}
	free = min(free, size)

	a4 := v4.Addr().As4()
	a6 := v6.Addr().As16()
	p := &Pool{
		v4:       v4,
		v6:       v6,
		base4:    binary.BigEndian.Uint32(a4[:]),
		base6hi:  binary.BigEndian.Uint64(a6[:8]),
		base6lo:  binary.BigEndian.Uint64(a6[8:]),
		reserved: uint32(reserved),
		capacity: uint32(free),
		reuse:    o.ReuseAfter,
		now:      o.Now,
		slots:    make(map[string]uint32),
		head:     -1,
		tail:     -1,
	}
	if p.reuse == 0 {
		p.reuse = DefaultReuseAfter
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.epoch = p.now()
	for _, n := range o.Pinned {
		name := normalizeName(n)
		if name == "" {
			return nil, fmt.Errorf("dnsintercept: cannot pin the root name %q", n)
		}
		if _, ok := p.slots[name]; ok {
			continue
		}
		if uint64(len(p.table)) >= uint64(p.capacity) {
			return nil, fmt.Errorf("dnsintercept: %d names to pin, but the pool has only %d slots", len(o.Pinned), p.capacity)
		}
		p.slots[name] = uint32(len(p.table))
		p.table = append(p.table, slot{name: name, pinned: true, prev: -1, next: -1})
	}
	return p, nil
}

// Assign returns the fake addresses of name. A name that has a slot keeps
// it (and the slot counts as used now); otherwise name gets the next
// never-used slot, or else the least recently used reusable slot that has
// been idle for ReuseAfter. name is normalized first (ASCII lower-case, one
// trailing dot removed), so "Example.COM." and "example.com" share a slot.
// It returns ErrPoolExhausted when name has no slot and none can be had.
func (p *Pool) Assign(name string) (v4, v6 netip.Addr, err error) {
	name = normalizeName(name)
	if name == "" {
		return netip.Addr{}, netip.Addr{}, errors.New("dnsintercept: cannot assign a fake address to the root name")
	}
	now := p.now().Sub(p.epoch)
	// Fast path, under the read lock: a name whose slot was used within
	// the last touchEvery need not be touched again (its place in the
	// reuse order is off by at most that, against a ReuseAfter of minutes).
	p.mu.RLock()
	n, ok := p.slots[name]
	fresh := ok && now-p.table[n].last < touchEvery
	p.mu.RUnlock()
	if fresh {
		v4, v6 = p.addrs(n)
		return v4, v6, nil
	}
	p.mu.Lock()
	n, ok = p.slots[name]
	switch {
	case ok:
		p.touchLocked(n, now)
	case uint64(len(p.table)) < uint64(p.capacity):
		n = uint32(len(p.table))
		p.table = append(p.table, slot{name: name, last: now, prev: -1, next: -1})
		p.slots[name] = n
		p.pushLocked(n)
	case p.head >= 0 && p.reuse > 0 && now-p.table[p.head].last >= p.reuse:
		n = uint32(p.head)
		s := &p.table[n]
		delete(p.slots, s.name)
		s.name = name
		p.slots[name] = n
		p.touchLocked(n, now)
	default:
		p.mu.Unlock()
		return netip.Addr{}, netip.Addr{}, ErrPoolExhausted
	}
	p.mu.Unlock()
	v4, v6 = p.addrs(n)
	return v4, v6, nil
}

// Acquire returns the name whose slot holds ip, like Name, and marks the
// slot as held by a flow: it is not reused until the matching Release. Every
// Acquire that reports true must be followed by exactly one Release of the
// same address when the flow ends.
func (p *Pool) Acquire(ip netip.Addr) (string, bool) {
	n, ok := p.slotOf(ip)
	if !ok {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if uint64(n) >= uint64(len(p.table)) {
		return "", false
	}
	s := &p.table[n]
	s.refs++
	p.unlinkLocked(n)
	return s.name, true
}

// Release ends what one Acquire of ip started. When no flow holds the slot
// any more, its idle time starts now.
func (p *Pool) Release(ip netip.Addr) {
	n, ok := p.slotOf(ip)
	if !ok {
		return
	}
	now := p.now().Sub(p.epoch)
	p.mu.Lock()
	defer p.mu.Unlock()
	if uint64(n) >= uint64(len(p.table)) || p.table[n].refs <= 0 {
		return // not acquired: a caller bug, but never a negative count
	}
	s := &p.table[n]
	s.refs--
	if s.refs == 0 {
		s.last = now
		p.pushLocked(n)
	}
}

// touchLocked marks slot n as used now.
func (p *Pool) touchLocked(n uint32, now time.Duration) {
	s := &p.table[n]
	s.last = now
	if s.inLRU {
		p.unlinkLocked(n)
		p.pushLocked(n)
	}
}

// pushLocked appends slot n to the reuse list if it may be reused.
func (p *Pool) pushLocked(n uint32) {
	s := &p.table[n]
	if s.pinned || s.refs > 0 || s.inLRU {
		return
	}
	s.inLRU = true
	s.prev, s.next = p.tail, -1
	if p.tail >= 0 {
		p.table[p.tail].next = int32(n)
	} else {
		p.head = int32(n)
	}
	p.tail = int32(n)
}

// unlinkLocked removes slot n from the reuse list, if it is there.
func (p *Pool) unlinkLocked(n uint32) {
	s := &p.table[n]
	if !s.inLRU {
		return
	}
	if s.prev >= 0 {
		p.table[s.prev].next = s.next
	} else {
		p.head = s.next
	}
	if s.next >= 0 {
		p.table[s.next].prev = s.prev
	} else {
		p.tail = s.prev
	}
	s.prev, s.next, s.inLRU = -1, -1, false
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
// addresses. It does not allocate, and does not count as a use of the slot.
func (p *Pool) Name(ip netip.Addr) (string, bool) {
	n, ok := p.slotOf(ip)
	if !ok {
		return "", false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if uint64(n) >= uint64(len(p.table)) {
		return "", false
	}
	return p.table[n].name, true
}

// slotOf returns the slot whose addresses include ip, assigned or not.
func (p *Pool) slotOf(ip netip.Addr) (uint32, bool) {
	off, ok := p.offset(ip)
	if !ok || off < uint64(p.reserved) || off-uint64(p.reserved) >= uint64(p.capacity) {
		return 0, false
	}
	return uint32(off - uint64(p.reserved)), true
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
	return len(p.table)
}

// ReuseAfter returns how long a slot must be idle before it may be reused;
// negative means never.
func (p *Pool) ReuseAfter() time.Duration { return p.reuse }

// Cap returns the total number of slots, taken or free.
func (p *Pool) Cap() int { return int(p.capacity) }
