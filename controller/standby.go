package controller

// Warm standbys on spares: a spare held for a running job of launcher.kind
// warm keeps a standby of that job ready, so that joining its next
// generation costs no Python start (agent/warm.go).

import (
	"maps"
	"sort"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
)

const (
	// spareStandbyKeep is how long an agent keeps a spare's standby
	// without being told again: a drop lost with a session or a leader
	// leaves a standby at most this long.
	spareStandbyKeep = 90 * time.Second
	// spareStandbyRenew is how often a held spare is told again, well
	// within spareStandbyKeep.
	spareStandbyRenew = spareStandbyKeep / 3
	// idleStandbyEvery bounds how often idle nodes' standbys are placed
	// again on passes that need no other pass over the nodes: a node that
	// went idle waits at most this long (and the scheduler's periodic
	// pass) to be told.
	idleStandbyEvery = time.Second
)

// toldStandby is the standby a node's agent was told to keep, on which
// session and when.
type toldStandby struct {
	sess    *session
	job     string
	created time.Time
	at      time.Time
}

// standbyTable is what agents were told of warm standbys, in memory only: a
// new session or a new leader starts with nothing told and tells again,
// and what an agent is never told again it drops after spareStandbyKeep.
// Guarded by Controller.mu.
type standbyTable struct {
	// told is the standby each node's agent was told to keep, by node.
	told map[string]*toldStandby
	// idle is where idle nodes keep standbys (placeIdleStandbys), placed
	// at idleAt: at most every idleStandbyEvery unless a pass builds the
	// candidates anyway.
	idle   map[string]string
	idleAt time.Time
}

// tell tells the agent of every spare held for a warm job, and of every
// idle node placed to keep one (placeIdleStandbys: node to job), to keep
// its standby (again when due), and every agent told before whose node is
// neither to drop it.
func (st *standbyTable) tell(nt nodeTable, jt jobTable, spares, idle map[string]string, now time.Time, log *zap.Logger) {
	if st.told == nil {
		st.told = map[string]*toldStandby{}
	}
	held := spares
	if len(idle) > 0 {
		held = make(map[string]string, len(spares)+len(idle))
		maps.Copy(held, idle)
		maps.Copy(held, spares)
	}
	for node, told := range st.told {
		ns := nt[node]
		switch {
		case ns == nil || ns.session != told.sess:
			// The agent's next session starts with nothing told.
			delete(st.told, node)
		case jt.warm(held[node]):
			// Told again below, the same job or another.
		case ns.job == told.job:
			// Assigned the job: the assignment takes the standby; a drop
			// sent before the assignment arrives would kill it.
			delete(st.told, node)
		default:
			ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_PrepareStandby{PrepareStandby: &rdzvv1.PrepareStandby{}}})
			delete(st.told, node)
		}
	}
	for node, job := range held {
		js, ns := jt[job], nt[node]
		if !jt.warm(job) || ns == nil || ns.session == nil {
			continue
		}
		created := js.rec.GetCreatedAt().AsTime()
		told := st.told[node]
		if told != nil && told.sess == ns.session && told.job == job && told.created.Equal(created) && now.Sub(told.at) < spareStandbyRenew {
			continue
		}
		if told == nil || told.job != job {
			msg := "spare keeps a warm standby"
			if spares[node] == "" {
				msg = "idle node keeps a warm standby"
			}
			log.Info(msg, zap.String("node", node), zap.String("job", job))
		}
		ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_PrepareStandby{PrepareStandby: &rdzvv1.PrepareStandby{
			Spec: js.rec.GetSpec(), JobCreatedAt: js.rec.GetCreatedAt(), KeepFor: durationpb.New(spareStandbyKeep),
		}}})
		st.told[node] = &toldStandby{sess: ns.session, job: job, created: created, at: now}
	}
}

// warmJobs are the running (or recovering) jobs of launcher.kind warm,
// oldest first, for placeIdleStandbys.
func (jt jobTable) warmJobs() []standbyJob {
	var warm []*jobState
	for _, js := range jt {
		st := js.rec.GetState()
		if (st == rdzvv1.JobState_JOB_STATE_RUNNING || st == rdzvv1.JobState_JOB_STATE_RECOVERING) && jt.warm(js.rec.GetSpec().GetName()) {
			warm = append(warm, js)
		}
	}
	sortOldestFirst(warm)
	out := make([]standbyJob, len(warm))
	for i, js := range warm {
		req := requirements(js.rec.GetSpec())
		out[i] = standbyJob{name: js.rec.GetSpec().GetName(), req: req}
	}
	return out
}

// withRounds is held (spares, node to job) plus the nodes of the warm
// jobs' current rounds, for placeIdleStandbys: such a node keeps its own
// job's standby (the agent starts one as each generation starts, and
// drops it when told the job ended), so one whose workers finished before
// the others' is no idle node to tell.
func (jt jobTable) withRounds(held map[string]string, jobs []standbyJob) map[string]string {
	out := make(map[string]string, len(held))
	maps.Copy(out, held)
	for _, j := range jobs {
		for _, a := range jt[j.name].members.Round().GetNodes() {
			if out[a.GetNode()] == "" {
				out[a.GetNode()] = j.name
			}
		}
	}
	return out
}

// jobs is the job each node's agent was last told to keep a standby for,
// in this session.
func (st *standbyTable) jobs() map[string]string {
	out := make(map[string]string, len(st.told))
	for node, told := range st.told {
		out[node] = told.job
	}
	return out
}

// nodes are, per job, the nodes told to keep its standby: a round of the
// job prefers them (rendezvous.Requirements.Prefer).
func (st *standbyTable) nodes() map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for node, told := range st.told {
		if out[told.job] == nil {
			out[told.job] = map[string]bool{}
		}
		out[told.job][node] = true
	}
	return out
}

// preferStandbys adds to told (the nodes told to keep the job's standby,
// may be nil) the nodes of the job's last round, which keep its standby
// of their own (the agent starts the next one as a generation starts).
func preferStandbys(told map[string]bool, round *rdzvv1.Round) map[string]bool {
	if len(round.GetNodes()) == 0 {
		return told
	}
	prefer := make(map[string]bool, len(told)+len(round.GetNodes()))
	maps.Copy(prefer, told)
	for _, a := range round.GetNodes() {
		prefer[a.GetNode()] = true
	}
	return prefer
}

// warm reports whether job exists and is of launcher.kind warm.
func (jt jobTable) warm(job string) bool {
	js := jt[job]
	return js != nil && js.rec.GetSpec().GetLauncherKind() == jobspec.KindWarm
}

// standbyJob is a running job of launcher.kind warm that idle nodes
// matching it may keep a standby for.
type standbyJob struct {
	name string
	req  rendezvous.Requirements
}

// placeIdleStandbys says which job each idle node keeps a warm standby
// for, so that a node replacing a lost one pays no Python start even
// without nodes.spares. jobs are the running warm jobs, oldest first. A
// node qualifies when it is eligible for a job as a round would take it
// (free, healthy, not cordoned or draining, enough GPUs, matching the
// selector) and is not held (held: node to job; a spare's standby is its
// holder's, and so is that of a node of the job's current round). Each node keeps at most one standby, for one
// job: the one it kept before (kept: node to job) while still eligible,
// so that standbys do not move between jobs as others come and go; else
// the job with the fewest standbys so far (spares' included), the oldest
// on a tie, nodes taken in name order. O(nodes × jobs), sorting only the
// nodes that need a new choice. A node that gets work leaves the answer
// (it is no longer free), which drops its standby.
func placeIdleStandbys(jobs []standbyJob, candidates []rendezvous.Candidate, held, kept map[string]string) map[string]string {
	out := map[string]string{}
	if len(jobs) == 0 {
		return out
	}
	index := make(map[string]int, len(jobs))
	count := make([]int, len(jobs))
	for i, j := range jobs {
		index[j.name] = i
	}
	for _, job := range held {
		if i, ok := index[job]; ok {
			count[i]++
		}
	}
	var fresh []rendezvous.Candidate
	for _, c := range candidates {
		if held[c.Name] != "" {
			continue
		}
		if i, ok := index[kept[c.Name]]; ok {
			if eligible, _ := rendezvous.Eligible(jobs[i].req, c); eligible {
				out[c.Name] = jobs[i].name
				count[i]++
				continue
			}
		}
		if c.Free && !c.Cordoned && c.Unhealthy == "" {
			fresh = append(fresh, c)
		}
	}
	sort.Slice(fresh, func(a, b int) bool { return fresh[a].Name < fresh[b].Name })
	for _, c := range fresh {
		best := -1
		for i, j := range jobs {
			if eligible, _ := rendezvous.Eligible(j.req, c); eligible && (best < 0 || count[i] < count[best]) {
				best = i
			}
		}
		if best >= 0 {
			out[c.Name] = jobs[best].name
			count[best]++
		}
	}
	return out
}
