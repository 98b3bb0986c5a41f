package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// nodeView builds the API's node field by field, sharing the record's
// messages: every field of a record with all of them set reaches the
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
	ns := &nodeState{rec: rec, lastSeen: time.Unix(5, 0), job: "train", generation: 7, health: health}

	view := (&Controller{}).nodeView(ns)
	v := view.ProtoReflect()
	for i := range fields.Len() {
		require.True(t, v.Has(fields.Get(i)), "the view drops %s", fields.Get(i).Name())
	}
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, view.GetState(), "ready and holding a job")
	require.Equal(t, "train", view.GetJob())
	require.Equal(t, uint64(7), view.GetGeneration())
	require.Equal(t, time.Unix(5, 0), view.GetLastHeartbeat().AsTime().Local())
	require.Same(t, &health[0], &view.GetHealthChecks()[0])
	require.Same(t, rec.GetInfo(), view.GetInfo(), "the record's info is shared, not copied")

	// The rest is the record's.
	fromMemory := func(n *rdzvv1.Node) *rdzvv1.Node {
		n = proto.Clone(n).(*rdzvv1.Node)
		n.State, n.Job, n.Generation, n.LastHeartbeat, n.HealthChecks = 0, "", 0, nil, nil
		return n
	}
	require.True(t, proto.Equal(fromMemory(rec), fromMemory(view)), "view %v of record %v", view, rec)
}
