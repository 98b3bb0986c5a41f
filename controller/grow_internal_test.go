package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
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

// A new in-memory step of the current generation is a moment to grow for a
// job whose state is replicated, and sets the cadence growth weighs; an
// older generation's, a step already heard of, or a job whose state is not
// replicated never are.
func TestNoteMemoryStep(t *testing.T) {
	t0 := time.Unix(1000, 0)
	job := func(replicated bool) *jobState {
		return &jobState{rec: &rdzvv1.Job{Generation: 2, Spec: &rdzvv1.JobSpec{Name: "train",
			CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1, Replicated: replicated}}}}
	}
	js := job(true)
	require.True(t, js.noteMemoryStep([]*rdzvv1.MemoryHeld{held(1, 90, 0, 1), held(2, 10, 0, 1)}, t0))
	require.EqualValues(t, 10, js.memNewest)
	require.Zero(t, js.memEvery, "one step: no cadence yet")
	require.False(t, js.noteMemoryStep([]*rdzvv1.MemoryHeld{held(2, 10, 2, 3)}, t0.Add(time.Second)), "a step heard of")
	require.False(t, js.noteMemoryStep([]*rdzvv1.MemoryHeld{held(1, 95, 0, 1)}, t0.Add(time.Second)), "an older generation's")
	require.True(t, js.noteMemoryStep([]*rdzvv1.MemoryHeld{held(2, 10, 0, 1), held(2, 12, 0, 1)}, t0.Add(2*time.Second)))
	require.Equal(t, 2*time.Second, js.memEvery)
	require.Equal(t, 2*time.Second, js.growCadence(), "no durable checkpoint yet")
	js.ckptEvery = time.Hour
	require.Equal(t, 2*time.Second, js.growCadence(), "the in-memory steps come sooner")
	js.ckptEvery = time.Second
	require.Equal(t, time.Second, js.growCadence())

	plain := job(false)
	require.False(t, plain.noteMemoryStep([]*rdzvv1.MemoryHeld{held(2, 10, 0, 1)}, t0), "not replicated: it grows at durable checkpoints only")
	require.Zero(t, plain.memNewest)
}
