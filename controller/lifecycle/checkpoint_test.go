package lifecycle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestOnCheckpoint(t *testing.T) {
	// job(running) is generation 3 at checkpoint step 40, started a minute
	// before t0; it has trained to step 50.
	report := func(gen, step uint64, source string) *rdzvv1.CheckpointReport {
		return &rdzvv1.CheckpointReport{Job: "train", Generation: gen, Step: step, Path: "/ckpt/step", Source: source}
	}
	for _, tc := range []struct {
		name         string
		state        rdzvv1.JobState
		prevAt       *timestamppb.Timestamp
		member       bool
		reportsSteps bool
		report       *rdzvv1.CheckpointReport
		stale        bool
		ignored      string
		recorded     bool
		every        time.Duration
	}{
		{name: "the running generation's next checkpoint", state: running, member: true, report: report(3, 45, "report"), recorded: true, every: time.Minute},
		{name: "cadence from the generation's previous checkpoint", state: running, prevAt: timestamppb.New(t0.Add(-10 * time.Second)), member: true,
			report: report(3, 45, "report"), recorded: true, every: 10 * time.Second},
		{name: "a fenced generation's late report", state: running, member: true, report: report(2, 45, "report"), stale: true},
		{name: "a later generation's report", state: running, member: true, report: report(4, 45, "report"), stale: true},
		{name: "a node outside the round", state: running, member: false, report: report(3, 45, "report"), stale: true},
		{name: "while recovering", state: recovering, member: true, report: report(3, 45, "report"), stale: true},
		{name: "while stopping", state: stopping, member: true, report: report(3, 45, "report"), stale: true},
		{name: "not newer than the latest", state: running, member: true, report: report(3, 40, "report")},
		{name: "scanned ahead of the steps trained", state: running, member: true, reportsSteps: true, report: report(3, 60, "scan"),
			ignored: "found on disk ahead of this generation's progress"},
		{name: "scanned within the steps trained", state: running, member: true, reportsSteps: true, report: report(3, 50, "scan"), recorded: true, every: time.Minute},
		{name: "scanned, the job reports no steps", state: running, member: true, report: report(3, 60, "scan"), recorded: true, every: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := job(tc.state, 0)
			rec.Step = 50
			rec.LatestCheckpoint.ReportedAt = tc.prevAt
			before := rec.String()
			d := OnCheckpoint(rec, "node-b", tc.member, tc.reportsSteps, tc.report, t0)
			require.Equal(t, before, rec.String(), "the record passed in is not changed")
			require.Equal(t, tc.stale, d.Stale)
			require.Equal(t, tc.ignored, d.Ignored)
			if !tc.recorded {
				require.Nil(t, d.Job)
				require.Nil(t, d.Event)
				return
			}
			require.Equal(t, tc.report.GetStep(), d.Job.GetLatestCheckpoint().GetStep())
			require.Equal(t, &rdzvv1.Checkpoint{Step: tc.report.GetStep(), Path: "/ckpt/step", Generation: 3, Node: "node-b",
				ReportedAt: timestamppb.New(t0), Source: tc.report.GetSource()}, d.Checkpoint)
			require.Equal(t, EventCheckpoint, d.Event.GetKind())
			require.Equal(t, "node-b", d.Event.GetNode())
			require.Equal(t, tc.every, d.Every)
		})
	}
}
