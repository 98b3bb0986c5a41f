package ha

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
		{"standby naming the leader", Error(ReasonNotLeader, "10.0.0.1:7070", "standby"), ReasonNotLeader, "10.0.0.1:7070", true},
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

func TestParseAddrs(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "10.0.0.1:7070", want: []string{"10.0.0.1:7070"}},
		{in: "a:7070, b:7070", want: []string{"a:7070", "b:7070"}},
		{in: "", wantErr: `--controller: "" is not host:port`},
		{in: "a:7070,b", wantErr: `--controller: "b" is not host:port`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseAddrs("--controller", tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
