package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestVerdict(t *testing.T) {
	const interval, timeout, vouched = time.Second, 5 * time.Second, 15 * time.Second
	tests := []struct {
		name      string
		silent    time.Duration
		deadVotes int
		vouchers  int
		want      liveness
	}{
		{"heartbeating", 500 * time.Millisecond, 0, 2, alive},
		{"one missed heartbeat is not enough even if a peer agrees", 1500 * time.Millisecond, 1, 1, alive},
		{"peers confirm a silent node fast", 2500 * time.Millisecond, 1, 1, peersConfirm},
		{"silent within the timeout, nobody objects", 4 * time.Second, 0, 0, alive},
		{"timed out without gossip", 6 * time.Second, 0, 0, timedOut},
		{"timed out but peers reach it: controller-side trouble", 6 * time.Second, 0, 2, peersVouch},
		{"peers' word lasts the vouched timeout", 15 * time.Second, 0, 2, peersVouch},
		{"peers' word has a limit", 16 * time.Second, 0, 2, timedOut},
		{"a dead vote beats vouchers", 6 * time.Second, 1, 2, peersConfirm},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, verdict(tt.silent, interval, timeout, vouched, tt.deadVotes, tt.vouchers))
		})
	}
}
