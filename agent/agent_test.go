package agent

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// fakeNet is a machine's network as the agent reads it; empty route
// answers are reported as lookup failures.
type fakeNet struct {
	ifaces       []netif.Interface
	ifacesErr    error
	defaultRoute string
	facing       string
}

func (f fakeNet) Interfaces() ([]netif.Interface, error) { return f.ifaces, f.ifacesErr }

func (f fakeNet) DefaultRouteInterface() (string, error) {
	if f.defaultRoute == "" {
		return "", errors.New("no default route")
	}
	return f.defaultRoute, nil
}

func (f fakeNet) InterfaceFacing(string) (string, error) {
	if f.facing == "" {
		return "", errors.New("no route")
	}
	return f.facing, nil
}

// failingGPUs is a node whose driver is broken.
type failingGPUs struct{}

func (failingGPUs) Discover(context.Context) ([]gpu.GPU, error) {
	return nil, errors.New("nvml: driver/library version mismatch")
}

func iface(name string, kind netif.Kind, addrs ...string) netif.Interface {
	ifc := netif.Interface{Name: name, Kind: kind, Up: true, MTU: 1500}
	for _, a := range addrs {
		ifc.Addrs = append(ifc.Addrs, netip.MustParsePrefix(a))
	}
	return ifc
}

var (
	lo   = iface("lo", netif.KindLoopback, "127.0.0.1/8", "::1/128")
	eth0 = iface("eth0", netif.KindEthernet, "10.0.0.5/24")
	eth1 = iface("eth1", netif.KindEthernet, "10.1.0.5/24")
	ib0  = iface("ib0", netif.KindInfiniBand, "192.168.0.5/16")
)

func TestDescribeChoosesInterface(t *testing.T) {
	tests := []struct {
		name       string
		explicit   string
		net        fakeNet
		wantIface  string
		wantAddr   string
		wantReason string
	}{
		{name: "explicit interface wins", explicit: "eth1",
			net:       fakeNet{ifaces: []netif.Interface{lo, eth0, eth1, ib0}, facing: "eth0", defaultRoute: "eth0"},
			wantIface: "eth1", wantAddr: "10.1.0.5", wantReason: "explicit --nccl-interface"},
		{name: "explicit loopback is allowed", explicit: "lo",
			net:       fakeNet{ifaces: []netif.Interface{lo, eth0}},
			wantIface: "lo", wantAddr: "127.0.0.1", wantReason: "explicit --nccl-interface"},
		{name: "controller-facing interface", net: fakeNet{ifaces: []netif.Interface{lo, eth0, eth1}, facing: "eth1", defaultRoute: "eth0"},
			wantIface: "eth1", wantAddr: "10.1.0.5", wantReason: "routes to the controller"},
		{name: "ethernet over loopback", net: fakeNet{ifaces: []netif.Interface{lo, eth0}, facing: "lo"},
			wantIface: "eth0", wantAddr: "10.0.0.5", wantReason: "only usable interface"},
		{name: "loopback when nothing else", net: fakeNet{ifaces: []netif.Interface{lo}, facing: "lo"},
			wantIface: "lo", wantAddr: "127.0.0.1", wantReason: "loopback fallback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Controller, cfg.NodeName, cfg.NCCLInterface = "127.0.0.1:7070", "gpu-01", tt.explicit
			cfg.Insecure = true // Describe connects to nothing
			a, err := New(cfg, zaptest.NewLogger(t), gpu.Fake{}, tt.net, ExecSpawner{})
			require.NoError(t, err)
			info, err := a.Describe(context.Background())
			require.NoError(t, err)
			require.Equal(t, tt.wantIface, info.GetNcclInterface())
			require.Equal(t, tt.wantAddr, info.GetAddress())
			require.Contains(t, info.GetNcclInterfaceReason(), tt.wantReason)
			require.Len(t, info.GetInterfaces(), len(tt.net.ifaces), "every interface is reported")
		})
	}
}

func TestDescribeFailures(t *testing.T) {
	tests := []struct {
		name     string
		explicit string
		net      fakeNet
		wantErr  string
	}{
		{name: "explicit interface missing", explicit: "ib9", net: fakeNet{ifaces: []netif.Interface{lo, eth0}},
			wantErr: "--nccl-interface ib9 does not exist"},
		{name: "no usable interface", net: fakeNet{ifaces: []netif.Interface{{Name: "eth0", Kind: netif.KindEthernet}}},
			wantErr: "no usable network interface"},
		{name: "interfaces unreadable", net: fakeNet{ifacesErr: errors.New("netlink: permission denied")},
			wantErr: "netlink: permission denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Controller, cfg.NodeName, cfg.NCCLInterface = "127.0.0.1:7070", "gpu-01", tt.explicit
			cfg.Insecure = true // Describe connects to nothing
			a, err := New(cfg, zaptest.NewLogger(t), gpu.Fake{}, tt.net, ExecSpawner{})
			require.NoError(t, err)
			_, err = a.Describe(context.Background())
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestDescribeNode(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	net := fakeNet{ifaces: []netif.Interface{lo, eth0, ib0}, defaultRoute: "eth0"}
	tests := []struct {
		name     string
		nodeName string
		fakeGPUs int
		gpus     GPUDiscoverer
		wantName string
		wantGPUs int
		wantFake bool
	}{
		{name: "fake gpus are labelled fake", nodeName: "gpu-01", fakeGPUs: 4, gpus: gpu.Fake{Count: 4, Node: "gpu-01"},
			wantName: "gpu-01", wantGPUs: 4, wantFake: true},
		{name: "discovered gpus", nodeName: "gpu-01", gpus: gpu.Fake{Count: 2, Node: "gpu-01"},
			wantName: "gpu-01", wantGPUs: 2},
		{name: "gpu discovery failure registers with none", nodeName: "gpu-01", gpus: failingGPUs{},
			wantName: "gpu-01"},
		{name: "name defaults to the hostname", gpus: gpu.Fake{}, wantName: host},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Controller, cfg.NodeName, cfg.FakeGPUs = "127.0.0.1:7070", tt.nodeName, tt.fakeGPUs
			cfg.Insecure = true // Describe connects to nothing
			cfg.Labels = map[string]string{"pool": "train"}
			a, err := New(cfg, zaptest.NewLogger(t), tt.gpus, net, ExecSpawner{})
			require.NoError(t, err)
			info, err := a.Describe(context.Background())
			require.NoError(t, err)
			require.Equal(t, tt.wantName, info.GetName())
			require.Equal(t, tt.wantFake, info.GetFakeGpus())
			require.Len(t, info.GetGpus(), tt.wantGPUs)
			for i, g := range info.GetGpus() {
				require.EqualValues(t, i, g.GetIndex())
				require.Equal(t, "GPU-fake-gpu-01-"+strconv.Itoa(i), g.GetUuid())
			}
			require.Equal(t, map[string]string{"pool": "train"}, info.GetLabels())
			require.Equal(t, Version, info.GetAgentVersion())
			require.Equal(t, "eth0", info.GetNcclInterface(), "the default route's interface")

			kinds := map[string]rdzvv1.InterfaceKind{}
			for _, ifc := range info.GetInterfaces() {
				kinds[ifc.GetName()] = ifc.GetKind()
			}
			require.Equal(t, map[string]rdzvv1.InterfaceKind{
				"lo":   rdzvv1.InterfaceKind_INTERFACE_KIND_LOOPBACK,
				"eth0": rdzvv1.InterfaceKind_INTERFACE_KIND_ETHERNET,
				"ib0":  rdzvv1.InterfaceKind_INTERFACE_KIND_INFINIBAND,
			}, kinds)
			require.Equal(t, []string{"127.0.0.1/8", "::1/128"}, info.GetInterfaces()[0].GetAddresses())
		})
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	_, err := New(DefaultConfig(), zaptest.NewLogger(t), gpu.Fake{}, fakeNet{}, ExecSpawner{})
	require.ErrorContains(t, err, "invalid agent config: controller:")
}
