package controller

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// longest keeps the largest duration noted by any stream's receiver until
// a liveness pass takes it, then starts again.
func TestLongest(t *testing.T) {
	var l longest
	require.Zero(t, l.take())
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() { defer wg.Done(); l.note(time.Duration(i) * time.Millisecond) }()
	}
	wg.Wait()
	require.Equal(t, 99*time.Millisecond, l.take())
	require.Zero(t, l.take(), "taken: starts again")
	l.note(time.Second)
	l.note(time.Millisecond)
	require.Equal(t, time.Second, l.take())
}
