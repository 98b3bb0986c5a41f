package controller

// Warm standbys on spares: a spare held for a running job of launcher.kind
// warm keeps a standby of that job ready, so that joining its next
// generation costs no Python start (agent/warm.go).

import (
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	// spareStandbyKeep is how long an agent keeps a spare's standby
	// without being told again: a drop lost with a session or a leader
	// leaves a standby at most this long.
	spareStandbyKeep = 90 * time.Second
	// spareStandbyRenew is how often a held spare is told again, well
	// within spareStandbyKeep.
	spareStandbyRenew = spareStandbyKeep / 3
)

// toldStandby is the standby a node's agent was told to keep, on which
// session and when.
type toldStandby struct {
	sess    *session
	job     string
	created time.Time
	at      time.Time
}

// tellSpares tells the agent of every spare held for a warm job to keep
// its standby (again when due), and every agent told before whose node is
// no longer held to drop it. Only in memory: a new session or a new leader
// starts with nothing told and tells again, and what an agent is never
// told again it drops after spareStandbyKeep. Callers hold c.mu.
func (c *Controller) tellSpares(held map[string]string) {
	if c.standbys == nil {
		c.standbys = map[string]*toldStandby{}
	}
	now := c.clock.Now()
	for node, told := range c.standbys {
		ns := c.nodes[node]
		switch {
		case ns == nil || ns.session != told.sess:
			// The agent's next session starts with nothing told.
			delete(c.standbys, node)
		case c.warm(held[node]):
			// Told again below, the same job or another.
		case ns.job == told.job:
			// Assigned the job: the assignment takes the standby; a drop
			// sent before the assignment arrives would kill it.
			delete(c.standbys, node)
		default:
			ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_PrepareStandby{PrepareStandby: &rdzvv1.PrepareStandby{}}})
			delete(c.standbys, node)
		}
	}
	for node, job := range held {
		js, ns := c.jobs[job], c.nodes[node]
		if !c.warm(job) || ns == nil || ns.session == nil {
			continue
		}
		created := js.rec.GetCreatedAt().AsTime()
		told := c.standbys[node]
		if told != nil && told.sess == ns.session && told.job == job && told.created.Equal(created) && now.Sub(told.at) < spareStandbyRenew {
			continue
		}
		if told == nil || told.job != job {
			c.log.Info("spare keeps a warm standby", zap.String("node", node), zap.String("job", job))
		}
		ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_PrepareStandby{PrepareStandby: &rdzvv1.PrepareStandby{
			Spec: js.rec.GetSpec(), JobCreatedAt: js.rec.GetCreatedAt(), KeepFor: durationpb.New(spareStandbyKeep),
		}}})
		c.standbys[node] = &toldStandby{sess: ns.session, job: job, created: created, at: now}
	}
}

// warm reports whether job exists and is of launcher.kind warm. Callers
// hold c.mu.
func (c *Controller) warm(job string) bool {
	js := c.jobs[job]
	return js != nil && js.rec.GetSpec().GetLauncherKind() == jobspec.KindWarm
}
