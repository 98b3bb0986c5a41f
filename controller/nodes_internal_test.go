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

// testNode is a node with rec as the controller keeps it: its
// registration apart (nodeInfo).
func testNode(t testing.TB, rec *rdzvv1.Node) *nodeState {
	t.Helper()
	ni, err := newNodeInfo(rec.GetInfo())
	require.NoError(t, err)
	rec = proto.Clone(rec).(*rdzvv1.Node)
	rec.Info = nil
	return &nodeState{rec: rec, info: ni}
}

// A registration kept compactly gives back what the agent sent, answers
// the controller's decisions from its own fields, tells a changed
// registration from an equal one however its maps were built, and shares
// the strings nodes have in common.
func TestNodeInfoKeepsTheRegistration(t *testing.T) {
	// fmt builds every string afresh, as decoding a message does.
	node := func(i int) *rdzvv1.NodeInfo {
		labels := map[string]string{}
		for _, k := range []string{"rack", "pool", "zone"} {
			labels[fmt.Sprint(k)] = fmt.Sprint("v-", k)
		}
		return &rdzvv1.NodeInfo{
			Name:          fmt.Sprintf("node-%d", i),
			AgentVersion:  "rdzv 1.2.3",
			NcclInterface: fmt.Sprint("ib0"),
			Address:       fmt.Sprintf("10.0.0.%d", i),
			GossipAddr:    fmt.Sprintf("10.0.0.%d:7946", i),
			Labels:        labels,
			Gpus: []*rdzvv1.GPU{
				{Index: 1, Uuid: fmt.Sprintf("GPU-%d-1", i), Name: "NVIDIA H100 80GB HBM3"},
				{Index: 0, Uuid: fmt.Sprintf("GPU-%d-0", i), Name: "NVIDIA H100 80GB HBM3"},
			},
			Interfaces: []*rdzvv1.NetworkInterface{{Name: "ib0", Addresses: []string{fmt.Sprintf("10.0.0.%d/24", i)}}},
		}
	}
	// unique may drop a copy at a collection nothing holds its handle
	// across; none may run between the two nodes here.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	a, err := newNodeInfo(node(1))
	require.NoError(t, err)
	b, err := newNodeInfo(node(2))
	require.NoError(t, err)

	require.True(t, proto.Equal(node(1), a.decode()), "decoded %v", a.decode())
	require.Equal(t, "node-1", a.name)
	require.Equal(t, "10.0.0.1", a.address)
	require.Equal(t, "10.0.0.1:7946", a.gossipAddr)
	require.Equal(t, "ib0", a.ncclInterface)
	require.Equal(t, node(1).GetLabels(), a.labels)
	require.Equal(t, []uint32{1, 0}, a.gpuIndices, "GPU indices in the registration's order")

	again, err := deterministic.Marshal(node(1))
	require.NoError(t, err)
	require.True(t, a.same(again), "an equal registration, its labels inserted afresh")
	changed := node(1)
	changed.Gpus = changed.Gpus[:1]
	enc, err := deterministic.Marshal(changed)
	require.NoError(t, err)
	require.False(t, a.same(enc), "a GPU fewer")
	require.False(t, a.same(b.encoded))

	mine := a.decode()
	mine.Name = "changed"
	require.Equal(t, "node-1", a.decode().GetName(), "a decoded registration is the caller's own")

	require.Same(t, unsafe.StringData(a.ncclInterface), unsafe.StringData(b.ncclInterface), "nccl_interface not shared")
	for k, v := range a.labels {
		for k2, v2 := range b.labels {
			if k == k2 {
				require.Same(t, unsafe.StringData(k), unsafe.StringData(k2), "label key %s not shared", k)
				require.Same(t, unsafe.StringData(v), unsafe.StringData(v2), "label %s's value not shared", k)
			}
		}
	}

	var none nodeInfo
	require.True(t, proto.Equal(&rdzvv1.NodeInfo{}, none.decode()), "the zero value is an empty registration")
}
