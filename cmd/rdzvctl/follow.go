package main

// Following events as they are written (WatchEvents): `events -f` and
// `start --wait` / `stop --wait`. Plain functions over the generated
// client, so that any command front end can call them.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/lifecycle"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	// followRetry is the pause before watching again after a watch ended
	// (a failover, a dropped connection, a watch that fell behind).
	followRetry = time.Second
	// followTail is how many past events `events -f` shows first.
	followTail = 20
	// waitReplay is how many of a job's events --wait shows from before it
	// began following.
	waitReplay = 1000
	// pendingRecheck is how often --wait asks why a job still waits for
	// nodes: that reason changes without an event.
	pendingRecheck = 2 * time.Second
)

// followEvents watches events as req asks and calls handle with each
// message until handle says done, handle fails, or ctx ends. A watch that
// ends for a reason waiting can cure (the controller lost the lead, the
// connection dropped, the watch fell behind) is resumed from the cursor of
// the last message, so nothing is missed or shown twice; warn hears why.
func followEvents(ctx context.Context, jobs rdzvv1.JobServiceClient, req *rdzvv1.WatchEventsRequest,
	handle func(*rdzvv1.WatchEventsResponse) (done bool, err error), warn func(error)) error {
	req = &rdzvv1.WatchEventsRequest{Job: req.GetJob(), Cursor: req.GetCursor(), Tail: req.GetTail()}
	for {
		handleErr, err := watchOnce(ctx, jobs, req, handle)
		if handleErr != nil || err == nil || ctx.Err() != nil {
			return errors.Join(handleErr, err)
		}
		if permanent(err) {
			return err
		}
		warn(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(followRetry):
		}
	}
}

// permanent reports whether an error is one that asking again will not
// change.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return true
	}
	return false
}

// watchOnce runs one watch; it returns handle's error, or the watch's,
// or neither once handle is done.
func watchOnce(ctx context.Context, jobs rdzvv1.JobServiceClient, req *rdzvv1.WatchEventsRequest,
	handle func(*rdzvv1.WatchEventsResponse) (bool, error)) (handleErr, watchErr error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := jobs.WatchEvents(wctx, req)
	if err != nil {
		return nil, err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the controller ended the watch")
			}
			return nil, err
		}
		// Resume after this message, not with the first request's tail.
		req.Cursor, req.Tail = m.GetCursor(), 0
		if done, err := handle(m); done || err != nil {
			return err, nil
		}
	}
}

// eventLine is one event as `events -f` and --wait print it.
func eventLine(ev *rdzvv1.Event) string {
	node := ev.GetNode()
	if node == "" {
		node = "-"
	}
	return fmt.Sprintf("%s  %-22s %-12s %s", ev.GetTime().AsTime().Local().Format("2006-01-02 15:04:05.000"), ev.GetKind(), node, ev.GetMessage())
}

// printEvents is a handle for followEvents that prints each event, one
// line of text or one JSON object a line.
func printEvents(w io.Writer, asJSON bool) func(*rdzvv1.WatchEventsResponse) (bool, error) {
	return func(m *rdzvv1.WatchEventsResponse) (bool, error) {
		ev := m.GetEvent()
		if ev == nil {
			return false, nil
		}
		if asJSON {
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
			if err != nil {
				return false, err
			}
			// protojson varies its spacing on purpose; a line is compact.
			var line bytes.Buffer
			if err := json.Compact(&line, b); err != nil {
				return false, err
			}
			line.WriteByte('\n')
			_, err = w.Write(line.Bytes())
			return false, err
		}
		_, err := fmt.Fprintln(w, eventLine(ev))
		return false, err
	}
}

// jobGetter is what waitForJob asks for a job's state.
type jobGetter func(ctx context.Context) (*rdzvv1.Job, error)

// waitForJob prints a job's events as they come, and why it waits while
// it is pending or recovering, until it ends; it returns the job as it
// ended. A failover or a dropped connection is ridden out: warn hears of
// it.
func waitForJob(ctx context.Context, jobs rdzvv1.JobServiceClient, name string, get jobGetter, w io.Writer, warn func(error)) (*rdzvv1.Job, error) {
	var created time.Time
	var lastReason string
	// caughtUp is set once the job's history has been shown.
	caughtUp := false
	// check reads the job; ended is set once it is over, err when asking
	// again will not help.
	check := func() (job *rdzvv1.Job, ended bool, err error) {
		job, err = get(ctx)
		if err != nil {
			if permanent(err) {
				return nil, true, err
			}
			warn(err)
			return nil, false, nil
		}
		created = job.GetCreatedAt().AsTime()
		if lifecycle.Terminal(job.GetState()) {
			return job, true, nil
		}
		switch st := job.GetState(); st {
		case rdzvv1.JobState_JOB_STATE_PENDING, rdzvv1.JobState_JOB_STATE_RECOVERING:
			// Why it waits is said after its history.
			if job.GetReason() != lastReason && caughtUp {
				lastReason = job.GetReason()
				fmt.Fprintf(w, "%s  %-22s %-12s %s\n", time.Now().Format("2006-01-02 15:04:05.000"), strings.ToLower(stateWord(st)), "-", lastReason)
			}
		}
		return job, false, nil
	}
	if job, ended, err := check(); ended {
		return job, err
	}

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan *rdzvv1.WatchEventsResponse)
	errc := make(chan error, 1)
	go func() {
		errc <- followEvents(fctx, jobs, &rdzvv1.WatchEventsRequest{Job: name, Tail: waitReplay}, func(m *rdzvv1.WatchEventsResponse) (bool, error) {
			select {
			case msgs <- m:
				return false, nil
			case <-fctx.Done():
				return true, nil
			}
		}, warn)
	}()
	recheck := time.NewTicker(pendingRecheck)
	defer recheck.Stop()
	// ended is the job once it has ended; its last event (written with
	// that state) is still to come when the state was read before the
	// event reached etcd, and is printed before returning.
	var ended *rdzvv1.Job
	sawEnd := false
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-errc:
			return nil, err
		case <-recheck.C:
			if lastReason == "" || ended != nil {
				continue // running: its events say what changes
			}
		case m := <-msgs:
			ev := m.GetEvent()
			if ev == nil {
				caughtUp = true
				break // say why the job waits
			}
			if ev.GetTime().AsTime().Before(created) { // older: an earlier run of the name
				continue
			}
			fmt.Fprintln(w, eventLine(ev))
			switch {
			case endsJob(ev.GetKind()):
				sawEnd = true
			case ev.GetKind() != "rendezvous_committed" && ev.GetKind() != "attempt_failed":
				continue // nothing to ask the job about
			}
		}
		job, end, err := check()
		switch {
		case err != nil:
			return nil, err
		case end:
			ended = job
		case job.GetState() == rdzvv1.JobState_JOB_STATE_RUNNING:
			lastReason = ""
		}
		if ended != nil && sawEnd {
			return ended, nil
		}
	}
}

// endsJob reports whether an event of kind ends a job.
func endsJob(kind string) bool {
	return kind == lifecycle.EventJobSucceeded || kind == lifecycle.EventJobFailed || kind == lifecycle.EventJobStopped
}

// incidentTable prints a job's incidents: each phase as the time since
// the failure was detected.
func incidentTable(out io.Writer, incs []*rdzvv1.Incident) {
	if len(incs) == 0 {
		return
	}
	fmt.Fprintln(out)
	w := table(out)
	fmt.Fprintln(w, "#\tGEN\tDETECTED\tFAULT\t+FENCE\t+COMMIT\t+STARTED\t+FIRST STEP\tREASON")
	for i, inc := range incs {
		detected := inc.GetDetectedAt().AsTime()
		since := func(ts *timestamppb.Timestamp) string {
			if ts == nil {
				return "-"
			}
			return "+" + ts.AsTime().Sub(detected).Round(time.Millisecond).String()
		}
		fault := "-" + detected.Sub(inc.GetFaultAt().AsTime()).Round(time.Millisecond).String()
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i+1, inc.GetGeneration(), detected.Local().Format("2006-01-02 15:04:05.000"), fault,
			since(inc.GetFencedAt()), since(inc.GetCommittedAt()), since(inc.GetStartedAt()), since(inc.GetFirstStepAt()), inc.GetReason())
	}
	_ = w.Flush()
}
