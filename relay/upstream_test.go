package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestUpstream(t *testing.T) {
	u := newUpstream()
	t0 := time.Unix(1000, 0)
	down, _ := u.state()
	require.False(t, down)
	require.False(t, u.pilot(t0), "no pilot while a controller serves: everyone tries")

	u.failed(t0)
	down, back := u.state()
	require.True(t, down)
	require.False(t, u.pilot(t0.Add(holdRetry/2)), "one try per holdRetry")
	require.True(t, u.pilot(t0.Add(holdRetry)))
	require.False(t, u.pilot(t0.Add(holdRetry)), "one pilot at a time")
	u.failed(t0.Add(holdRetry + time.Millisecond))
	require.False(t, u.pilot(t0.Add(2*holdRetry)), "counted from the last failed try")
	require.True(t, u.pilot(t0.Add(2*holdRetry+time.Millisecond)))
	select {
	case <-back:
		require.FailNow(t, "released while down")
	default:
	}

	u.served()
	select {
	case <-back:
	default:
		require.FailNow(t, "a served stream releases the held")
	}
	down, _ = u.state()
	require.False(t, down)
	u.served() // twice is fine

	u.failed(t0.Add(time.Hour))
	_, again := u.state()
	select {
	case <-again:
		require.FailNow(t, "down again: a new wait")
	default:
	}
}
