package controller

import (
	"context"
	"time"
)

// Settle waits until everything the controller decided so far is durable
// in etcd, for tests that read etcd directly after seeing a state through
// the API (which shows decisions as soon as they are made).
func Settle(ctx context.Context, c *Controller) error { return c.settle(ctx) }

// CheckLiveness runs one liveness pass at the clock's current time, as the
// liveness loop does on each tick. Tests on a fake clock call it to know
// that a pass has seen a given instant: the loop's ticker stays armed while
// a pass runs, so waiting on the clock's waiters cannot tell whether the
// loop has acted on a tick yet. A pass is idempotent at one instant, so it
// running beside the loop's own changes nothing.
func CheckLiveness(c *Controller) { c.checkLiveness() }

// WithLag replaces the controller's measure of its own lag (the Go
// runtime's run-queue waits and the longest message handling, in real
// time): a controller on a fake clock must not credit its nodes with the
// test machine's scheduling.
func WithLag(waited func() time.Duration) Option {
	return func(ctl *Controller) { ctl.lag.waited = waited }
}

// NoteLag measures the controller's lag as the liveness loop does before
// each pass, so that a test knows the next pass credits it.
func NoteLag(c *Controller) { c.lag.note(c.clock.Now()) }

// SpareStandbyRenew is how often a held spare is told again (standby.go).
const SpareStandbyRenew = spareStandbyRenew

// SchedulePass runs one scheduling pass now, as the loop does when woken,
// so that a test knows every decision the state allows has been taken.
func SchedulePass(ctx context.Context, c *Controller) { c.schedule(ctx) }
