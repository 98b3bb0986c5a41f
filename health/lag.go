package health

import "time"

// LagWindow keeps the controller's recent lag samples (how late it ran its
// own work) for a window: a lag seen at t may have held up heartbeats
// that it processes only later, so it is credited (Silence.Lag) until a
// heartbeat timeout after t. It keeps only the samples that can still be
// the window's maximum, so it stays small whatever the sampling rate.
type LagWindow struct {
	window  time.Duration
	samples []lagSample // decreasing lag, increasing time
}

type lagSample struct {
	at  time.Time
	lag time.Duration
}

// NewLagWindow remembers lags for window.
func NewLagWindow(window time.Duration) *LagWindow { return &LagWindow{window: window} }

// Observe records a lag seen at now.
func (w *LagWindow) Observe(now time.Time, lag time.Duration) {
	if lag <= 0 {
		return
	}
	// A sample no larger than this one and no later can never again be the
	// maximum.
	i := len(w.samples)
	for i > 0 && w.samples[i-1].lag <= lag {
		i--
	}
	w.samples = append(w.samples[:i], lagSample{at: now, lag: lag})
}

// Max is the largest lag seen within the window before now.
func (w *LagWindow) Max(now time.Time) time.Duration {
	i := 0
	for i < len(w.samples) && now.Sub(w.samples[i].at) > w.window {
		i++
	}
	w.samples = w.samples[i:]
	if len(w.samples) == 0 {
		return 0
	}
	return w.samples[0].lag
}
