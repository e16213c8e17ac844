package main

import (
	"errors"
	"testing"
)

func TestParseByteSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"256MiB", 256 << 20},
		{"256M", 256 << 20},
		{"1GiB", 1 << 30},
		{"1G", 1 << 30},
		{"512KiB", 512 << 10},
		{" 64 MiB ", 64 << 20},
		{"268435456", 268435456},
		{"0", 0},
	} {
		got, err := parseByteSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "MiB", "-1M", "1.5G", "12TB", "9999999999G", "lots"} {
		if _, err := parseByteSize(in); !errors.Is(err, errByteSize) {
			t.Errorf("parseByteSize(%q) err = %v, want errByteSize", in, err)
		}
	}
	var b byteSize
	if err := b.Set("256MiB"); err != nil || b.String() != "256MiB" {
		t.Errorf("byteSize round trip: %v %q", err, b.String())
	}
}

func TestLimitFlagsRefuseNonsense(t *testing.T) {
	ok := limitFlags{maxTCP: 1, maxUDP: 1, maxHandshakes: 1, handshake: defaultHandshakeTimeout, maxMemory: defaultMaxMemory}
	if err := ok.check(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for name, mod := range map[string]func(*limitFlags){
		"no TCP flows":      func(l *limitFlags) { l.maxTCP = 0 },
		"no UDP sessions":   func(l *limitFlags) { l.maxUDP = -1 },
		"no handshakes":     func(l *limitFlags) { l.maxHandshakes = 0 },
		"a zero timeout":    func(l *limitFlags) { l.handshake = 0 },
		"too little memory": func(l *limitFlags) { l.maxMemory = 1 << 20 },
	} {
		l := ok
		mod(&l)
		if err := l.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
