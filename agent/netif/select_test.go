package netif_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rdzv/rdzv/agent/netif"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type opt func(*netif.Interface)

func down(i *netif.Interface) { i.Up = false }

func speed(mbps int) opt { return func(i *netif.Interface) { i.SpeedMbps = mbps } }

func rdma(devs ...string) opt { return func(i *netif.Interface) { i.RDMADevices = devs } }

func addrs(prefixes ...string) opt {
	return func(i *netif.Interface) {
		for _, p := range prefixes {
			i.Addrs = append(i.Addrs, netip.MustParsePrefix(p))
		}
	}
}

func mk(name string, kind netif.Kind, opts ...opt) netif.Interface {
	i := netif.Interface{Name: name, Kind: kind, Up: true, MTU: 1500}
	for _, o := range opts {
		o(&i)
	}
	return i
}

var (
	lo      = mk("lo", netif.KindLoopback, addrs("127.0.0.1/8", "::1/128"))
	eth0    = mk("eth0", netif.KindEthernet, addrs("10.0.0.5/24"), speed(25000))
	eth1    = mk("eth1", netif.KindEthernet, addrs("10.1.0.5/24"), speed(25000))
	ib0     = mk("ib0", netif.KindInfiniBand, addrs("10.2.0.5/24"), speed(56000), rdma("mlx5_0"))
	docker0 = mk("docker0", netif.KindVirtual, addrs("172.17.0.1/16"))
	abr     = mk("a-bridge", netif.KindVirtual, addrs("192.168.122.1/24"))
)

func TestSelect(t *testing.T) {
	tests := []struct {
		name        string
		ifaces      []netif.Interface
		opts        netif.SelectOptions
		wantName    string
		wantAddr    string
		wantReason  string
		wantErr     error
		wantErrText []string
	}{
		{
			name:       "explicit ok",
			ifaces:     []netif.Interface{lo, eth0, ib0},
			opts:       netif.SelectOptions{Explicit: "ib0", ControllerFacing: "eth0", DefaultRoute: "eth0"},
			wantName:   "ib0",
			wantAddr:   "10.2.0.5",
			wantReason: "explicit --nccl-interface",
		},
		{
			name:       "explicit may name a virtual interface",
			ifaces:     []netif.Interface{eth0, docker0},
			opts:       netif.SelectOptions{Explicit: "docker0"},
			wantName:   "docker0",
			wantAddr:   "172.17.0.1",
			wantReason: "explicit --nccl-interface",
		},
		{
			name:        "explicit missing",
			ifaces:      []netif.Interface{lo, eth0, mk("eth9", netif.KindEthernet, addrs("10.9.0.1/24"), down)},
			opts:        netif.SelectOptions{Explicit: "ib7", ControllerFacing: "eth0"},
			wantErr:     netif.ErrNoInterface,
			wantErrText: []string{"ib7", "does not exist", "usable: eth0 10.0.0.5, lo 127.0.0.1)"},
		},
		{
			name:        "explicit down",
			ifaces:      []netif.Interface{lo, eth0, mk("ib0", netif.KindInfiniBand, addrs("10.2.0.5/24"), down)},
			opts:        netif.SelectOptions{Explicit: "ib0"},
			wantErr:     netif.ErrNoInterface,
			wantErrText: []string{"ib0", "is down", "eth0 10.0.0.5"},
		},
		{
			name:        "explicit without ipv4",
			ifaces:      []netif.Interface{mk("eth0", netif.KindEthernet, addrs("fe80::1/64", "169.254.3.4/16"))},
			opts:        netif.SelectOptions{Explicit: "eth0"},
			wantErr:     netif.ErrNoInterface,
			wantErrText: []string{"eth0", "has no ipv4 address", "usable: none"},
		},
		{
			name:       "controller-facing ethernet",
			ifaces:     []netif.Interface{lo, eth0, eth1, ib0},
			opts:       netif.SelectOptions{ControllerFacing: "eth1", DefaultRoute: "eth0"},
			wantName:   "eth1",
			wantAddr:   "10.1.0.5",
			wantReason: "routes to the controller",
		},
		{
			name:       "controller on loopback uses the default route",
			ifaces:     []netif.Interface{lo, eth0, eth1},
			opts:       netif.SelectOptions{ControllerFacing: "lo", DefaultRoute: "eth1"},
			wantName:   "eth1",
			wantAddr:   "10.1.0.5",
			wantReason: "holds the default route",
		},
		{
			name:       "controller behind docker0 uses the default route",
			ifaces:     []netif.Interface{lo, docker0, eth0},
			opts:       netif.SelectOptions{ControllerFacing: "docker0", DefaultRoute: "eth0"},
			wantName:   "eth0",
			wantAddr:   "10.0.0.5",
			wantReason: "holds the default route",
		},
		{
			name:       "stale controller-facing name is ignored",
			ifaces:     []netif.Interface{lo, eth0},
			opts:       netif.SelectOptions{ControllerFacing: "eth7", DefaultRoute: "eth0"},
			wantName:   "eth0",
			wantAddr:   "10.0.0.5",
			wantReason: "holds the default route",
		},
		{
			name:       "down default route falls through",
			ifaces:     []netif.Interface{lo, mk("eth0", netif.KindEthernet, addrs("10.0.0.5/24"), down), eth1},
			opts:       netif.SelectOptions{DefaultRoute: "eth0"},
			wantName:   "eth1",
			wantAddr:   "10.1.0.5",
			wantReason: "only usable interface",
		},
		{
			name:       "docker0 and bridges never chosen when ethernet exists",
			ifaces:     []netif.Interface{abr, docker0, lo, eth0},
			opts:       netif.SelectOptions{ControllerFacing: "lo", DefaultRoute: "a-bridge"},
			wantName:   "eth0",
			wantAddr:   "10.0.0.5",
			wantReason: "only usable interface",
		},
		{
			name:       "only loopback",
			ifaces:     []netif.Interface{lo},
			opts:       netif.SelectOptions{ControllerFacing: "lo", DefaultRoute: "lo"},
			wantName:   "lo",
			wantAddr:   "127.0.0.1",
			wantReason: "loopback fallback: nothing else reaches the controller",
		},
		{
			name:       "loopback beats virtual",
			ifaces:     []netif.Interface{docker0, lo, mk("eth0", netif.KindEthernet, addrs("10.0.0.5/24"), down)},
			wantName:   "lo",
			wantAddr:   "127.0.0.1",
			wantReason: "loopback fallback: nothing else reaches the controller",
		},
		{
			name:    "no interfaces",
			wantErr: netif.ErrNoInterface,
		},
		{
			name:        "nothing eligible",
			ifaces:      []netif.Interface{docker0, mk("lo", netif.KindLoopback, addrs("127.0.0.1/8"), down)},
			wantErr:     netif.ErrNoInterface,
			wantErrText: []string{"docker0 (virtual)", "lo (loopback, down)"},
		},
		{
			name:       "infiniband preferred over faster ethernet",
			ifaces:     []netif.Interface{lo, mk("eth0", netif.KindEthernet, addrs("10.0.0.5/24"), speed(100000)), ib0},
			wantName:   "ib0",
			wantAddr:   "10.2.0.5",
			wantReason: "best of 2 usable interfaces (rdma, then link speed, then name)",
		},
		{
			name:       "roce preferred over plain ethernet",
			ifaces:     []netif.Interface{eth0, mk("eth1", netif.KindEthernet, addrs("10.1.0.5/24"), rdma("mlx5_1"))},
			wantName:   "eth1",
			wantAddr:   "10.1.0.5",
			wantReason: "best of 2 usable interfaces (rdma, then link speed, then name)",
		},
		{
			name:       "faster ethernet preferred",
			ifaces:     []netif.Interface{eth0, mk("eth1", netif.KindEthernet, addrs("10.1.0.5/24"), speed(100000))},
			wantName:   "eth1",
			wantAddr:   "10.1.0.5",
			wantReason: "best of 2 usable interfaces (rdma, then link speed, then name)",
		},
		{
			name:       "link-local only is not eligible",
			ifaces:     []netif.Interface{mk("eth0", netif.KindEthernet, addrs("169.254.9.9/16")), eth1},
			wantName:   "eth1",
			wantAddr:   "10.1.0.5",
			wantReason: "only usable interface",
		},
		{
			name:       "ipv4 picked after ipv6 and link-local",
			ifaces:     []netif.Interface{mk("eth0", netif.KindEthernet, addrs("2001:db8::5/64", "169.254.1.1/16", "10.0.0.5/24", "10.0.0.6/24"))},
			opts:       netif.SelectOptions{ControllerFacing: "eth0"},
			wantName:   "eth0",
			wantAddr:   "10.0.0.5",
			wantReason: "routes to the controller",
		},
		{
			name:       "unknown kind is usable",
			ifaces:     []netif.Interface{lo, mk("enp1s0", netif.KindUnknown, addrs("10.0.0.5/24"))},
			wantName:   "enp1s0",
			wantAddr:   "10.0.0.5",
			wantReason: "only usable interface",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := netif.Select(tt.ifaces, tt.opts)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				for _, s := range tt.wantErrText {
					require.ErrorContains(t, err, s)
				}
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantName, got.Interface.Name)
			require.Equal(t, netip.MustParseAddr(tt.wantAddr), got.Address)
			require.Equal(t, tt.wantReason, got.Reason)
		})
	}
}

func TestSelectIsDeterministic(t *testing.T) {
	ifaces := []netif.Interface{
		lo, docker0,
		mk("eth2", netif.KindEthernet, addrs("10.0.2.5/24")),
		mk("eth0", netif.KindEthernet, addrs("10.0.0.5/24")),
		mk("eth1", netif.KindEthernet, addrs("10.0.1.5/24")),
	}
	for i := range ifaces {
		t.Run(ifaces[i].Name+" first", func(t *testing.T) {
			rotated := append(slices.Clone(ifaces[i:]), ifaces[:i]...)
			before := slices.Clone(rotated)

			got, err := netif.Select(rotated, netif.SelectOptions{})
			require.NoError(t, err)
			require.Equal(t, "eth0", got.Interface.Name)
			require.Equal(t, before, rotated, "Select must not reorder its input")
		})
	}
}

func TestKindString(t *testing.T) {
	tests := []struct {
		kind netif.Kind
		want string
	}{
		{netif.KindUnknown, "unknown"},
		{netif.KindLoopback, "loopback"},
		{netif.KindEthernet, "ethernet"},
		{netif.KindInfiniBand, "infiniband"},
		{netif.KindVirtual, "virtual"},
		{netif.Kind(42), "Kind(42)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			require.Equal(t, tt.want, tt.kind.String())
		})
	}
}
