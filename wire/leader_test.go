package wire

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrorRoundTrip(t *testing.T) {
	tests := []struct {
		name          string
		err           error
		wantReason    string
		wantLeader    string
		wantIsRefusal bool
	}{
		{"follower naming the leader", Error(ReasonNotLeader, "10.0.0.1:7070", "follower"), ReasonNotLeader, "10.0.0.1:7070", true},
		{"no leader", Error(ReasonNoLeader, "", "election"), ReasonNoLeader, "", true},
		{"etcd down", Error(ReasonEtcdUnavailable, "", "no quorum"), ReasonEtcdUnavailable, "", true},
		{"wrapped", fmt.Errorf("registering: %w", Error(ReasonNotLeader, "b:1", "x")), ReasonNotLeader, "b:1", true},
		{"transport failure", status.Error(codes.Unavailable, "connection refused"), "", "", false},
		{"an answer", status.Error(codes.NotFound, "job x not found"), "", "", false},
		{"not a status", errors.New("boom"), "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason, leader, ok := Parse(tt.err)
			require.Equal(t, tt.wantIsRefusal, ok)
			require.Equal(t, tt.wantReason, reason)
			require.Equal(t, tt.wantLeader, leader)
			if ok {
				require.Equal(t, codes.Unavailable, status.Code(tt.err), "clients that know nothing of HA retry it")
			}
		})
	}
}
