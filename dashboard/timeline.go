package dashboard

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// chartWidth is the width of an incident's bar in the SVG chart; the
// phases share it in proportion to their durations.
const (
	chartWidth = 640.0
	// minPhaseWidth keeps a phase that took no visible time visible.
	minPhaseWidth = 3.0
)

// timeline is one incident drawn as bars, a phase each.
type timeline struct {
	N        int
	Incident *rdzvv1.Incident
	Phases   []phase
	// Total is from the fault to the last phase reached; Open says the
	// recovery has not reached its last phase.
	Total string
	Open  bool
	Width float64
}

// phase is the interval between two marks of an incident.
type phase struct {
	Name     string // CSS class and data-phase: detect, fence, commit, start, resume
	Label    string
	Duration string
	X, W     float64
}

func newTimeline(n int, inc *rdzvv1.Incident) timeline {
	marks := []struct {
		name, label string
		at          *timestamppb.Timestamp
	}{
		{"detect", "fault → detected", inc.GetDetectedAt()},
		{"fence", "detected → fenced", inc.GetFencedAt()},
		{"commit", "fenced → rendezvous committed", inc.GetCommittedAt()},
		{"start", "committed → workers started", inc.GetStartedAt()},
		{"resume", "started → first step", inc.GetFirstStepAt()},
	}
	t := timeline{N: n, Incident: inc, Width: chartWidth}
	from := inc.GetFaultAt().AsTime()
	start := from
	var durs []time.Duration
	for _, m := range marks {
		if m.at == nil {
			break
		}
		to := m.at.AsTime()
		d := max(to.Sub(from), 0)
		durs = append(durs, d)
		t.Phases = append(t.Phases, phase{Name: m.name, Label: m.label, Duration: d.Round(time.Millisecond).String()})
		from = to
	}
	t.Open = inc.GetStartedAt() == nil
	total := max(from.Sub(start), 0)
	t.Total = total.Round(time.Millisecond).String()
	// Widths in proportion, each at least minPhaseWidth, scaled so that
	// the bar fills the chart.
	var sum float64
	widths := make([]float64, len(durs))
	for i, d := range durs {
		w := minPhaseWidth
		if total > 0 {
			w = max(chartWidth*float64(d)/float64(total), minPhaseWidth)
		}
		widths[i], sum = w, sum+w
	}
	x := 0.0
	for i := range t.Phases {
		w := widths[i] * chartWidth / max(sum, chartWidth)
		t.Phases[i].X, t.Phases[i].W = x, w
		x += w
	}
	return t
}
