// Cluster DNS for the test tier's real node (test/support/kube-node.ts): CoreDNS's own server and
// kubernetes plugin, with only the plugins our Corefile names compiled in, instead of the ~60 of
// CoreDNS's default build (whose cloud DNS plugins pull in every cloud SDK). Registration is
// CoreDNS's: each plugin package registers itself in init(), and dnsserver.Directives (CoreDNS's
// generated order of all plugins) decides the order in a server block.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func main() {
	coremain.Run()
}
