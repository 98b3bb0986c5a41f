package netif

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sysfs builds a fake /sys laid out like the real one: class entries are
// symlinks into /sys/devices, and "device" links point at PCI functions.
type sysfs struct {
	t    *testing.T
	root string
}

func (s sysfs) file(path, content string) {
	s.t.Helper()
	full := filepath.Join(s.root, path)
	require.NoError(s.t, os.MkdirAll(filepath.Dir(full), 0o755))
	require.NoError(s.t, os.WriteFile(full, []byte(content+"\n"), 0o644))
}

func (s sysfs) dir(path string) {
	s.t.Helper()
	require.NoError(s.t, os.MkdirAll(filepath.Join(s.root, path), 0o755))
}

// link creates path as a symlink to target, both relative to the root. The
// link is absolute because its directory may itself be reached through a
// symlink, which would throw a relative target off.
func (s sysfs) link(path, target string) {
	s.t.Helper()
	full := filepath.Join(s.root, path)
	require.NoError(s.t, os.MkdirAll(filepath.Dir(full), 0o755))
	require.NoError(s.t, os.Symlink(filepath.Join(s.root, target), full))
}

// nic adds a PCI-backed interface.
func (s sysfs) nic(name, pci string, typ, speed string) {
	s.dir("devices/pci0000:00/" + pci + "/net/" + name)
	s.link("class/net/"+name, "devices/pci0000:00/"+pci+"/net/"+name)
	s.link("class/net/"+name+"/device", "devices/pci0000:00/"+pci)
	s.file("class/net/"+name+"/type", typ)
	s.file("class/net/"+name+"/speed", speed)
}

// virt adds an interface with no bus device, as veths, bonds and bridges are.
func (s sysfs) virt(name, speed string) {
	s.dir("devices/virtual/net/" + name)
	s.link("class/net/"+name, "devices/virtual/net/"+name)
	s.file("class/net/"+name+"/type", "1")
	if speed != "" {
		s.file("class/net/"+name+"/speed", speed)
	}
}

// bridge adds a bridge enslaving ports.
func (s sysfs) bridge(name string, ports ...string) {
	s.virt(name, "")
	s.dir("class/net/" + name + "/bridge")
	s.dir("class/net/" + name + "/brif")
	for _, p := range ports {
		s.link("class/net/"+name+"/brif/"+p, "class/net/"+p)
	}
}

// hca registers an RDMA device on the PCI function that carries netdev.
func (s sysfs) hca(dev, pci string) {
	s.dir("devices/pci0000:00/" + pci + "/infiniband/" + dev)
	s.link("class/infiniband/"+dev, "devices/pci0000:00/"+pci+"/infiniband/"+dev)
	s.link("class/infiniband/"+dev+"/device", "devices/pci0000:00/"+pci)
}

func TestEnrich(t *testing.T) {
	s := sysfs{t: t, root: t.TempDir()}
	s.nic("eno1", "0000:01:00.0", "1", "25000")
	s.nic("ib0", "0000:3b:00.0", "32", "200000")
	s.hca("mlx5_0", "0000:3b:00.0")
	s.nic("eth2", "0000:5e:00.0", "1", "100000")
	s.nic("eth3", "0000:5e:00.1", "1", "100000")
	s.hca("mlx5_2", "0000:5e:00.0")
	s.hca("mlx5_3", "0000:5e:00.1")
	s.nic("eth4", "0000:60:00.0", "1", "-1")
	s.nic("eth5", "0000:61:00.0", "1", "")
	s.virt("veth1a2b", "10000")
	s.virt("vnet0", "10")
	s.bridge("docker0", "veth1a2b")
	s.bridge("virbr0", "vnet0")
	s.bridge("cbr0")
	s.bridge("br0", "eno1")
	s.virt("bond0", "50000")
	s.bridge("br1", "bond0")
	s.bridge("br-ex", "eno1")
	s.virt("flannel.1", "")
	s.virt("tunl0", "")
	s.virt("eth0.100", "")
	s.virt("ifb0", "")

	// Inside a network namespace the veth peer is renamed eth0 and sysfs is
	// remounted for the namespace, so this tree stands for that view.
	ns := sysfs{t: t, root: t.TempDir()}
	ns.virt("eth0", "10000")

	tests := []struct {
		name      string
		root      string
		ifc       Interface
		wantKind  Kind
		wantSpeed int
		wantRDMA  []string
	}{
		{name: "pci nic", ifc: Interface{Name: "eno1"}, wantKind: KindEthernet, wantSpeed: 25000},
		{name: "ipoib", ifc: Interface{Name: "ib0"}, wantKind: KindInfiniBand, wantSpeed: 200000, wantRDMA: []string{"mlx5_0"}},
		{name: "roce port 0", ifc: Interface{Name: "eth2"}, wantKind: KindEthernet, wantSpeed: 100000, wantRDMA: []string{"mlx5_2"}},
		{name: "roce port 1", ifc: Interface{Name: "eth3"}, wantKind: KindEthernet, wantSpeed: 100000, wantRDMA: []string{"mlx5_3"}},
		{name: "negative speed", ifc: Interface{Name: "eth4"}, wantKind: KindEthernet},
		{name: "unparsable speed", ifc: Interface{Name: "eth5"}, wantKind: KindEthernet},
		{name: "host-side veth", ifc: Interface{Name: "veth1a2b"}, wantKind: KindVirtual, wantSpeed: 10000},
		{name: "docker bridge", ifc: Interface{Name: "docker0"}, wantKind: KindVirtual},
		{name: "libvirt bridge", ifc: Interface{Name: "virbr0"}, wantKind: KindVirtual},
		{name: "bridge without ports", ifc: Interface{Name: "cbr0"}, wantKind: KindVirtual},
		{name: "bridge over nic", ifc: Interface{Name: "br0"}, wantKind: KindEthernet},
		{name: "bridge over bond", ifc: Interface{Name: "br1"}, wantKind: KindEthernet},
		{name: "bridge over nic despite br- name", ifc: Interface{Name: "br-ex"}, wantKind: KindEthernet},
		{name: "bond", ifc: Interface{Name: "bond0"}, wantKind: KindEthernet, wantSpeed: 50000},
		{name: "vlan", ifc: Interface{Name: "eth0.100"}, wantKind: KindEthernet},
		{name: "traffic shaping block", ifc: Interface{Name: "ifb0"}, wantKind: KindVirtual},
		{name: "flannel", ifc: Interface{Name: "flannel.1"}, wantKind: KindVirtual},
		{name: "ipip tunnel", ifc: Interface{Name: "tunl0"}, wantKind: KindVirtual},
		{name: "renamed veth in namespace", root: ns.root, ifc: Interface{Name: "eth0"}, wantKind: KindEthernet, wantSpeed: 10000},
		{name: "absent from sysfs", ifc: Interface{Name: "enp9s0"}, wantKind: KindUnknown},
		{name: "absent from sysfs with container name", ifc: Interface{Name: "cali12ab"}, wantKind: KindVirtual},
		{name: "loopback flag wins", ifc: Interface{Name: "eno1", Kind: KindLoopback}, wantKind: KindLoopback, wantSpeed: 25000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := s.root
			if tt.root != "" {
				root = tt.root
			}
			d := &SystemDetector{SysRoot: root}
			ifc := tt.ifc
			d.enrich(&ifc)
			require.Equal(t, tt.wantKind, ifc.Kind)
			require.Equal(t, tt.wantSpeed, ifc.SpeedMbps)
			require.Equal(t, tt.wantRDMA, ifc.RDMADevices)
		})
	}
}

func TestParseDefaultRoute(t *testing.T) {
	const header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT                                                       \n"
	tests := []struct {
		name    string
		routes  string
		want    string
		wantErr string
	}{
		{
			name: "single default",
			routes: header +
				"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0                                                                               \n" +
				"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0                                                                               \n",
			want: "eth0",
		},
		{
			name: "lowest metric wins",
			routes: header +
				"wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n" +
				"eno1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n" +
				"eno2\t00000000\t0100010A\t0003\t0\t0\t200\t00000000\t0\t0\t0\n",
			want: "eno1",
		},
		{
			name: "first of equal metrics",
			routes: header +
				"eno2\t00000000\t0100010A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n" +
				"eno1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n",
			want: "eno2",
		},
		{
			name: "vpn half-default is not a default route",
			routes: header +
				"tun0\t00000000\t0100080A\t0003\t0\t0\t0\t00000080\t0\t0\t0\n" +
				"eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n",
			want: "eth0",
		},
		{
			name: "unreachable default is skipped",
			routes: header +
				"*\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n" +
				"eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n",
			want: "eth0",
		},
		{
			name:   "no default route",
			routes: header + "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
			want:   "",
		},
		{name: "header only", routes: header, want: ""},
		{name: "empty", routes: "", want: ""},
		{
			name:    "truncated line",
			routes:  header + "eth0\t00000000\t010200C0\n",
			wantErr: "line 2",
		},
		{
			name:    "bad metric",
			routes:  header + "eth0\t00000000\t010200C0\t0003\t0\t0\tx\t00000000\t0\t0\t0\n",
			wantErr: `metric "x"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDefaultRoute(strings.NewReader(tt.routes))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestDefaultRouteInterfaceReadsProcRoot(t *testing.T) {
	proc := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "net"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(proc, "net", "route"), []byte(
		"Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"+
			"eno1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"), 0o644))

	got, err := (&SystemDetector{ProcRoot: proc}).DefaultRouteInterface()
	require.NoError(t, err)
	require.Equal(t, "eno1", got)

	_, err = (&SystemDetector{ProcRoot: t.TempDir()}).DefaultRouteInterface()
	require.ErrorIs(t, err, os.ErrNotExist)
}

// The tests below read this machine, which is assumed to have a loopback
// interface and nothing else in particular.

func TestSystemDetectorFindsLoopback(t *testing.T) {
	ifaces, err := (&SystemDetector{}).Interfaces()
	require.NoError(t, err)

	i := slices.IndexFunc(ifaces, func(ifc Interface) bool { return ifc.Name == "lo" })
	require.GreaterOrEqual(t, i, 0, "lo not found in %v", ifaces)
	lo := ifaces[i]
	require.Equal(t, KindLoopback, lo.Kind)
	require.True(t, lo.Up)
	require.Contains(t, lo.Addrs, netip.MustParsePrefix("127.0.0.1/8"))
}

func TestSystemDetectorDefaultRoute(t *testing.T) {
	// Whether there is a default route depends on the host; parsing the real
	// file must work either way.
	_, err := (&SystemDetector{}).DefaultRouteInterface()
	require.NoError(t, err)
}

func TestInterfaceFacing(t *testing.T) {
	tests := []struct {
		target  string
		want    string
		wantErr string
	}{
		{target: "127.0.0.1", want: "lo"},
		{target: "127.0.0.1:29400", want: "lo"},
		{target: "localhost:29400", want: "lo"},
		{target: "not-a-host-without-port", wantErr: "missing port"},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			got, err := (&SystemDetector{}).InterfaceFacing(tt.target)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
