package main

import "testing"

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
