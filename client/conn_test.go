package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/internal/testaddr"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// electing answers ListJobs as a controller does while an election is
// under way, for its first refusals calls, then serves: no one leads, or,
// with staleLeader, a standby still names the leader that died.
type electing struct {
	rdzvv1.UnimplementedJobServiceServer
	refusals    int64
	staleLeader string
	calls       atomic.Int64
}

func (e *electing) ListJobs(context.Context, *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	if e.calls.Add(1) <= e.refusals {
		if e.staleLeader != "" {
			return nil, wire.Error(wire.ReasonNotLeader, e.staleLeader, "a standby; the leader is "+e.staleLeader)
		}
		return nil, wire.Error(wire.ReasonNoLeader, "", "no controller leads yet; retry")
	}
	return &rdzvv1.ListJobsResponse{Jobs: []*rdzvv1.Job{{}}}, nil
}

func serve(t *testing.T, srv rdzvv1.JobServiceServer) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer()
	rdzvv1.RegisterJobServiceServer(s, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(l)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return l.Addr().String()
}

// A call made while no controller leads waits for the election, within
// its deadline; without one, or past it, the caller gets the refusal.
func TestCallsWaitOutAnElection(t *testing.T) {
	defer goleak.VerifyNone(t)
	tests := []struct {
		name     string
		refusals int64
		// leaderDied: the standby names a leader that no longer answers.
		leaderDied bool
		deadline   time.Duration
		wantErr    bool
		// minCalls, maxCalls bound how often the call was made.
		minCalls, maxCalls int64
	}{
		{name: "election ends in time", refusals: 3, deadline: 10 * time.Second, minCalls: 4, maxCalls: 4},
		{name: "the named leader died", refusals: 3, leaderDied: true, deadline: 10 * time.Second, minCalls: 4, maxCalls: 4},
		{name: "no deadline: no wait", refusals: 3, wantErr: true, minCalls: 1, maxCalls: 1},
		{name: "election outlasts the deadline", refusals: 1 << 30, deadline: time.Second, wantErr: true, minCalls: 2, maxCalls: 1 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &electing{refusals: tt.refusals}
			addrs := []string{serve(t, srv)}
			if tt.leaderDied {
				srv.staleLeader = testaddr.Free(t)
				addrs = append([]string{srv.staleLeader}, addrs...)
			}
			conn, err := client.NewConn(addrs, func(string) (credentials.TransportCredentials, error) {
				return insecure.NewCredentials(), nil
			})
			require.NoError(t, err)
			defer conn.Close()
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			resp, err := rdzvv1.NewJobServiceClient(conn).ListJobs(ctx, &rdzvv1.ListJobsRequest{})
			if tt.wantErr {
				reason, _, ok := wire.Parse(err)
				require.True(t, ok, "not the controller's refusal: %v", err)
				require.Equal(t, wire.ReasonNoLeader, reason)
			} else {
				require.NoError(t, err)
				require.Len(t, resp.GetJobs(), 1)
			}
			require.GreaterOrEqual(t, srv.calls.Load(), tt.minCalls)
			require.LessOrEqual(t, srv.calls.Load(), tt.maxCalls)
		})
	}
}
