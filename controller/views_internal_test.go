package controller

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// apiView builds the API's node field by field, sharing the record's
// messages and decoding its registration: every field of a record with all of them set reaches the
// view, those the controller keeps in memory from memory, the rest as
// recorded. A field added to Node fails here until the view shows it.
func TestNodeViewKeepsEveryField(t *testing.T) {
	at := func(s int) *timestamppb.Timestamp { return timestamppb.New(time.Unix(int64(s), 0)) }
	rec := &rdzvv1.Node{
		Info:             &rdzvv1.NodeInfo{Name: "n1", Address: "10.0.0.1"},
		State:            rdzvv1.NodeState_NODE_STATE_READY,
		Job:              "recorded-job",
		Generation:       1,
		RegisteredAt:     at(1),
		LastHeartbeat:    at(2),
		StateChangedAt:   at(3),
		Cordoned:         true,
		CordonReason:     "maintenance",
		RestartHoldUntil: at(4),
		Draining:         true,
		HealthChecks:     []*rdzvv1.HealthCheckResult{{Name: "recorded"}},
	}
	m := rec.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		require.True(t, m.Has(fields.Get(i)), "the test's record lacks %s: set it above", fields.Get(i).Name())
	}
	health := []*rdzvv1.HealthCheckResult{{Name: "xid"}}
	ns := testNode(t, rec)
	ns.lastSeen, ns.job, ns.generation, ns.health = time.Unix(5, 0), "train", 7, health

	view := ns.apiView()
	v := view.ProtoReflect()
	for i := range fields.Len() {
		require.True(t, v.Has(fields.Get(i)), "the view drops %s", fields.Get(i).Name())
	}
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, view.GetState(), "ready and holding a job")
	require.Equal(t, "train", view.GetJob())
	require.Equal(t, uint64(7), view.GetGeneration())
	require.Equal(t, time.Unix(5, 0), view.GetLastHeartbeat().AsTime().Local())
	require.Same(t, &health[0], &view.GetHealthChecks()[0])
	require.NotSame(t, rec.GetInfo(), view.GetInfo(), "the registration is decoded for the view")

	// The rest is the record's.
	fromMemory := func(n *rdzvv1.Node) *rdzvv1.Node {
		n = proto.Clone(n).(*rdzvv1.Node)
		n.State, n.Job, n.Generation, n.LastHeartbeat, n.HealthChecks = 0, "", 0, nil, nil
		return n
	}
	require.True(t, proto.Equal(fromMemory(rec), fromMemory(view)), "view %v of record %v", view, rec)
}

// BenchmarkNodeView is one node of a listing as the API builds it, its
// registration decoded, against the deep copy of its record that apiView
// made before the registration was kept encoded (the baseline, in the same
// run): an 8-GPU node as the agent's discovery describes it.
func BenchmarkNodeView(b *testing.B) {
	info := &rdzvv1.NodeInfo{Name: "node-0001", Address: "10.0.0.1", AgentVersion: "rdzv 1.0", NcclInterface: "ib0",
		NcclInterfaceReason: "fastest interface with an address", Labels: map[string]string{"rack": "r1", "pool": "train"}}
	for i := range 8 {
		info.Gpus = append(info.Gpus, &rdzvv1.GPU{Index: uint32(i), Uuid: fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000000", i),
			Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, PciBusId: fmt.Sprintf("00000000:%02x:00.0", 0x18+i)})
	}
	info.Interfaces = []*rdzvv1.NetworkInterface{{Name: "ib0", Addresses: []string{"10.0.0.1/24"}, Mtu: 4092, Up: true, SpeedMbps: 400000, RdmaDevices: []string{"mlx5_0"}}}
	now := timestamppb.Now()
	rec := &rdzvv1.Node{Info: info, State: rdzvv1.NodeState_NODE_STATE_READY, RegisteredAt: now, StateChangedAt: now}
	ns := testNode(b, rec)
	ns.lastSeen = time.Now()
	b.Run("deep copy (before)", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := proto.Clone(rec).(*rdzvv1.Node)
			n.LastHeartbeat, n.State = timestamppb.New(ns.lastSeen), viewState(ns)
		}
	})
	b.Run("view", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ns.apiView()
		}
	})
}
