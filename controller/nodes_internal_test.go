package controller

import (
	"fmt"
	"runtime/debug"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Two nodes' registrations, decoded separately, share the bytes of what
// they have in common once interned, and keep their own values and
// contents otherwise.
func TestInternSharesCommonStrings(t *testing.T) {
	// fmt builds every string afresh, as decoding a message does.
	node := func(i int) *rdzvv1.NodeInfo {
		return &rdzvv1.NodeInfo{
			Name:                fmt.Sprintf("node-%d", i),
			AgentVersion:        fmt.Sprintf("rdzv %s", "1.2.3"),
			NcclInterface:       fmt.Sprint("ib0"),
			NcclInterfaceReason: fmt.Sprint("fastest interface with an address"),
			Address:             fmt.Sprintf("10.0.0.%d", i),
			Labels:              map[string]string{fmt.Sprint("rack"): fmt.Sprint("r1")},
			Gpus: []*rdzvv1.GPU{{
				Uuid: fmt.Sprintf("GPU-%d", i), Name: fmt.Sprint("NVIDIA H100 80GB HBM3"), PciBusId: fmt.Sprint("00000000:18:00.0"),
			}},
			Interfaces: []*rdzvv1.NetworkInterface{{
				Name: fmt.Sprint("ib0"), Addresses: []string{fmt.Sprintf("10.0.0.%d/24", i)}, RdmaDevices: []string{fmt.Sprint("mlx5_0")},
			}},
		}
	}
	// unique may drop a copy at a collection nothing holds its handle
	// across (the controller accepts one more copy then); none may run
	// between the two nodes here.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	a, b := node(1), node(2)
	wantA, wantB := proto.Clone(a), proto.Clone(b)
	intern(a)
	intern(b)
	intern(nil)
	require.True(t, proto.Equal(wantA, a), "interning changed node 1's registration")
	require.True(t, proto.Equal(wantB, b), "interning changed node 2's registration")

	labelKey := func(info *rdzvv1.NodeInfo) string {
		for k := range info.Labels {
			return k
		}
		return ""
	}
	for _, tc := range []struct {
		field string
		of    func(*rdzvv1.NodeInfo) string
	}{
		{"agent_version", func(n *rdzvv1.NodeInfo) string { return n.AgentVersion }},
		{"nccl_interface", func(n *rdzvv1.NodeInfo) string { return n.NcclInterface }},
		{"nccl_interface_reason", func(n *rdzvv1.NodeInfo) string { return n.NcclInterfaceReason }},
		{"labels key", labelKey},
		{"labels value", func(n *rdzvv1.NodeInfo) string { return n.Labels[labelKey(n)] }},
		{"gpus.name", func(n *rdzvv1.NodeInfo) string { return n.Gpus[0].Name }},
		{"gpus.pci_bus_id", func(n *rdzvv1.NodeInfo) string { return n.Gpus[0].PciBusId }},
		{"interfaces.name", func(n *rdzvv1.NodeInfo) string { return n.Interfaces[0].Name }},
		{"interfaces.rdma_devices", func(n *rdzvv1.NodeInfo) string { return n.Interfaces[0].RdmaDevices[0] }},
	} {
		require.Same(t, unsafe.StringData(tc.of(a)), unsafe.StringData(tc.of(b)), "%s not shared", tc.field)
	}
	require.NotEqual(t, a.Gpus[0].Uuid, b.Gpus[0].Uuid)
}
