package sandbox

import (
	"net/netip"
	"testing"
)

func TestResolvConfCarriesSearchAndOptions(t *testing.T) {
	n := NetConfig{
		Resolver4: netip.MustParseAddr("198.18.0.1"),
		Search:    []string{"corp.test", "bad\nnameserver 192.0.2.66", "", "lab.corp.test"},
		Options:   []string{"ndots:2", "edns0", "x y", "timeout:1"},
	}
	want := "# written by tunwall: every DNS query from this sandbox is answered by tunwall\n" +
		"nameserver 198.18.0.1\n" +
		"search corp.test lab.corp.test\n" +
		"options ndots:2 edns0 timeout:1 trust-ad\n"
	if got := n.ResolvConf(); got != want {
		t.Errorf("ResolvConf =\n%s\nwant\n%s", got, want)
	}
	n = NetConfig{Resolver4: netip.MustParseAddr("198.18.0.1")}
	if got, want := n.ResolvConf(), "# written by tunwall: every DNS query from this sandbox is answered by tunwall\nnameserver 198.18.0.1\noptions edns0 trust-ad\n"; got != want {
		t.Errorf("without a search list: ResolvConf =\n%s\nwant\n%s", got, want)
	}
}
