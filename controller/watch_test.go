package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

type eventStream = grpc.ServerStreamingClient[rdzvv1.WatchEventsResponse]

func (c *cluster) watch(ctx context.Context, req *rdzvv1.WatchEventsRequest) eventStream {
	c.t.Helper()
	s, err := c.jobs.WatchEvents(ctx, req)
	require.NoError(c.t, err)
	return s
}

// caughtUp reads a watch's replay up to its caught_up message.
func caughtUp(t *testing.T, s eventStream) (replayed []*rdzvv1.WatchEventsResponse, cursor string) {
	t.Helper()
	for {
		m, err := s.Recv()
		require.NoError(t, err)
		if m.GetCaughtUp() {
			require.Nil(t, m.GetEvent())
			return replayed, m.GetCursor()
		}
		replayed = append(replayed, m)
	}
}

// nextKind reads the watch until an event of kind arrives, and returns it
// with the events before it.
func nextKind(t *testing.T, s eventStream, kind string) (*rdzvv1.WatchEventsResponse, []*rdzvv1.WatchEventsResponse) {
	t.Helper()
	var before []*rdzvv1.WatchEventsResponse
	for {
		m, err := s.Recv()
		require.NoError(t, err)
		if m.GetEvent().GetKind() == kind {
			return m, before
		}
		before = append(before, m)
	}
}

func kinds(ms []*rdzvv1.WatchEventsResponse) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.GetEvent().GetKind()+"/"+m.GetEvent().GetNode())
	}
	return out
}

// A watch replays what it is asked for, then streams what is written,
// and one resumed from any cursor goes on without a gap or a repeat.
func TestWatchEvents(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(rpcCtx(t))
	defer cancel()

	all := c.watch(ctx, &rdzvv1.WatchEventsRequest{})
	replayed, start := caughtUp(t, all)
	require.Empty(t, replayed, "no tail asked for")

	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.spec("train", 1, 1, "hang"))
	a.run()
	started, before := nextKind(t, all, controller.EventWorkersRunning)
	seen := append(before, started)
	require.Contains(t, kinds(seen), controller.EventNodeRegistered+"/node-a")
	require.Contains(t, kinds(seen), controller.EventJobSubmitted+"/")

	// Resumed from the start, and from each event seen: the same events
	// follow, in the same order.
	for i, from := range append([]string{start}, cursors(seen)...) {
		s := c.watch(ctx, &rdzvv1.WatchEventsRequest{Cursor: from})
		again, _ := caughtUp(t, s)
		require.GreaterOrEqual(t, len(again), len(seen)-i)
		require.Equal(t, kinds(seen[i:]), kinds(again)[:len(seen)-i], "resumed after event %d", i)
	}

	// A job's watch sees its events only; a tail replays the newest.
	job := c.watch(ctx, &rdzvv1.WatchEventsRequest{Job: "train", Tail: 2})
	tail, _ := caughtUp(t, job)
	require.Len(t, tail, 2)
	require.Equal(t, controller.EventWorkersRunning, tail[1].GetEvent().GetKind())
	c.stopJob("train")
	stopping, _ := nextKind(t, job, controller.EventJobStopping)
	require.Equal(t, "train", stopping.GetEvent().GetJob())

	for _, bad := range []*rdzvv1.WatchEventsRequest{
		{Cursor: "nonsense"},
		{Job: "train", Cursor: "5-other/00000000000000000001-000000000001"},
		{Job: "Bad/Name"},
		{Tail: 10001},
	} {
		_, err := c.watch(ctx, bad).Recv()
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v: %v", bad, err)
	}
}

func cursors(ms []*rdzvv1.WatchEventsResponse) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.GetCursor())
	}
	return out
}

// A watch ends with the not-leader refusal when its controller loses the
// lead; resumed from its last cursor, it follows the new leader.
func TestWatchEventsFollowsTheLeader(t *testing.T) {
	h := newHACluster(t, 2)
	first := h.leader()
	ctx, cancel := context.WithCancel(rpcCtx(t))
	defer cancel()
	s := h.watch(ctx, &rdzvv1.WatchEventsRequest{})
	_, cursor := caughtUp(t, s)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{h.etcd}, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	require.NoError(t, err)
	defer cli.Close()
	resp, err := cli.Get(rpcCtx(t), store.CandidatesPrefix(), clientv3.WithFirstCreate()...)
	require.NoError(t, err)
	_, err = cli.Revoke(rpcCtx(t), clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)

	// The new leader's election may come through the old watch before it
	// ends (etcd is shared), or through the resumed one: exactly once.
	var seen []*rdzvv1.WatchEventsResponse
	for {
		m, err := s.Recv()
		if err != nil {
			reason, _, ok := wire.Parse(err)
			require.True(t, ok, "not the not-leader refusal: %v", err)
			require.Equal(t, wire.ReasonNoLeader, reason)
			break
		}
		seen, cursor = append(seen, m), m.GetCursor()
	}
	second := h.leader(first)
	resumed := h.watch(ctx, &rdzvv1.WatchEventsRequest{Cursor: cursor})
	replayed, _ := caughtUp(t, resumed)
	seen = append(seen, replayed...)
	elected := func() int {
		n := 0
		for _, m := range seen {
			if m.GetEvent().GetKind() == controller.EventLeaderElected && strings.Contains(m.GetEvent().GetMessage(), "controller "+second.addr) {
				n++
			}
		}
		return n
	}
	if elected() == 0 {
		m, _ := nextKind(t, resumed, controller.EventLeaderElected)
		seen = append(seen, m)
	}
	require.Equal(t, 1, elected(), "the new leader's election, once: %v", kinds(seen))
}

// A watcher that reads slower than events are written is dropped with
// RESOURCE_EXHAUSTED, not buffered without bound; resumed from its last
// cursor it gets the rest, each event once.
func TestWatchEventsDropsASlowWatcher(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(rpcCtx(t))
	defer cancel()
	s := c.watch(ctx, &rdzvv1.WatchEventsRequest{Job: "flood"})
	_, cursor := caughtUp(t, s)

	// Written behind the controller's back, far more than a watcher's
	// buffer and the stream's flow-control windows hold, while the
	// watcher reads nothing.
	const total = 4000
	cli := c.etcdClient()
	padding := strings.Repeat("x", 1000)
	for i := 0; i < total; i += 100 {
		var ops []clientv3.Op
		for j := i; j < i+100; j++ {
			b, err := proto.Marshal(&rdzvv1.Event{Job: "flood", Kind: "test", Message: fmt.Sprintf("%d %s", j, padding)})
			require.NoError(t, err)
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sflood/%020d-%012d", "/rdzv/v1/events/", j, j), string(b)))
		}
		_, err := cli.Txn(rpcCtx(t)).Then(ops...).Commit()
		require.NoError(t, err)
	}

	got := 0
	dropped := false
	for got < total {
		m, err := s.Recv()
		if err != nil {
			require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
			require.False(t, dropped, "dropped twice although reading as fast as it can")
			dropped = true
			s = c.watch(ctx, &rdzvv1.WatchEventsRequest{Job: "flood", Cursor: cursor})
			continue
		}
		if m.GetCaughtUp() {
			continue
		}
		require.Equal(t, fmt.Sprintf("%d %s", got, padding), m.GetEvent().GetMessage(), "in order, without a gap or a repeat")
		got++
		cursor = m.GetCursor()
	}
	require.True(t, dropped, "the slow watcher was never dropped")
}
