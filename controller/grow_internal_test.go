package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJoinWait(t *testing.T) {
	for _, tt := range []struct {
		name    string
		warm    bool
		ready   string
		cadence time.Duration
		seenFor time.Duration
		wait    bool
	}{
		{"warm, standby not ready, frequent checkpoints", true, "", 5 * time.Second, time.Second, true},
		{"another job's standby is ready", true, "other", 5 * time.Second, time.Second, true},
		{"the job's standby is ready", true, "job", 5 * time.Second, time.Second, false},
		{"not warm: nothing to wait for", false, "", 5 * time.Second, time.Second, false},
		{"cadence unknown", true, "", 0, time.Second, false},
		{"rare checkpoints: grow cold now", true, "", time.Hour, time.Second, false},
		{"cadence at the bound", true, "", growStandbyWait, time.Second, true},
		{"free too long: its standby is not coming", true, "", 5 * time.Second, growStandbyWait, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.wait, joinWait(tt.warm, tt.ready, "job", tt.cadence, tt.seenFor))
		})
	}
}

// A heartbeat's standby_ready is what the session says until the next.
func TestSessionStandbyReady(t *testing.T) {
	s := &session{}
	require.Empty(t, s.readyStandby())
	s.noteStandby("job")
	require.Equal(t, "job", s.readyStandby())
	p := s.standbyReady.Load()
	s.noteStandby("job")
	require.Same(t, p, s.standbyReady.Load(), "unchanged: nothing allocated")
	s.noteStandby("")
	require.Empty(t, s.readyStandby())
}
