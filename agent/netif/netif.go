// Package netif finds the network interface NCCL and Gloo should use
// (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) and the IPv4 address to advertise
// with it. Addresses come from the interfaces themselves, never from the
// hostname: a hostname that resolves to 127.0.1.1 or to the management
// network is the classic way torchrun ends up on the wrong link.
package netif

import (
	"fmt"
	"net/netip"
)

// Kind is what an interface is physically, as far as interface selection is
// concerned.
type Kind int

// Kinds of interface. KindUnknown is left when sysfs has nothing on the
// interface, and is treated like Ethernet.
const (
	KindUnknown Kind = iota
	KindLoopback
	KindEthernet
	KindInfiniBand
	KindVirtual
)

func (k Kind) String() string {
	switch k {
	case KindUnknown:
		return "unknown"
	case KindLoopback:
		return "loopback"
	case KindEthernet:
		return "ethernet"
	case KindInfiniBand:
		return "infiniband"
	case KindVirtual:
		return "virtual"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// Interface is one network interface of this machine.
type Interface struct {
	Name string
	// Index is the kernel's ifindex.
	Index int
	Kind  Kind
	// Up means administratively up and with carrier: an interface that is up
	// but unplugged cannot carry NCCL traffic.
	Up  bool
	MTU int
	// Addrs holds all addresses, IPv4 and IPv6, in kernel order.
	Addrs []netip.Prefix
	// SpeedMbps is 0 when the link does not report a speed.
	SpeedMbps int
	// RDMADevices are the RDMA devices (such as mlx5_0) behind this interface,
	// for RoCE NICs and IPoIB alike.
	RDMADevices []string
}

// ipv4 returns the first IPv4 address peers can reach. Link-local
// (169.254/16) addresses are skipped: they are what an interface gets when
// DHCP failed and do not route between nodes.
func (i Interface) ipv4() (netip.Addr, bool) {
	for _, p := range i.Addrs {
		if a := p.Addr().Unmap(); a.Is4() && !a.IsLinkLocalUnicast() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (i Interface) rdma() bool {
	return i.Kind == KindInfiniBand || len(i.RDMADevices) > 0
}
