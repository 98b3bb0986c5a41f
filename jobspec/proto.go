package jobspec

import (
	"math"

	"google.golang.org/protobuf/types/known/durationpb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// ToProto converts a defaulted Spec for the wire.
func (s *Spec) ToProto() *rdzvv1.JobSpec {
	p := &rdzvv1.JobSpec{
		Name:               s.Name,
		NodesMin:           uint32(s.Nodes.Min),
		NodesMax:           uint32(s.Nodes.Max),
		NodesSpares:        uint32(s.Nodes.Spares),
		NodesGrow:          s.Nodes.Grow,
		GpusPerNode:        uint32(s.GPUsPerNode),
		ProcsPerNode:       uint32(s.ProcsPerNode),
		Command:            s.Command,
		Workdir:            s.Workdir,
		Env:                s.Env,
		SecretEnv:          s.SecretEnv,
		EnvFiles:           s.EnvFiles,
		RunAs:              s.RunAs,
		Selector:           s.Selector,
		CheckpointDir:      s.Checkpoint.Dir,
		LauncherTorchrun:   s.Launcher.Torchrun,
		LauncherExtraArgs:  s.Launcher.ExtraArgs,
		LauncherKind:       s.Launcher.Kind,
		LauncherKindReason: s.Launcher.KindReason,
		LauncherPython:     s.Launcher.Python,
		LauncherModule:     s.Launcher.Module,
		LauncherExecutable: s.Launcher.Executable,
		LauncherArgv:       s.Launcher.Argv,
		LauncherPreload:    s.Launcher.Preload,
		CheckpointMarkers:  s.Checkpoint.Markers,
	}
	if m := s.Checkpoint.Memory; m != nil {
		p.CheckpointMemory = &rdzvv1.CheckpointMemorySpec{Replicas: uint32(m.Replicas), MaxBytes: uint64(m.MaxBytes), PersistEvery: uint32(m.PersistEvery), Replicated: m.Replicated}
	}
	if s.Restart.MaxRestarts != nil {
		p.RestartMaxRestarts = uint32(*s.Restart.MaxRestarts)
	}
	if b := s.Restart.Backoff.Initial; b != nil {
		p.RestartBackoffInitial = durationpb.New(b.Duration)
	}
	if b := s.Restart.Backoff.Max; b != nil {
		p.RestartBackoffMax = durationpb.New(b.Duration)
	}
	if t := s.Health.ProgressTimeout; t != nil {
		p.HealthProgressTimeout = durationpb.New(t.Duration)
	}
	if t := s.Health.CheckpointTimeout; t != nil {
		p.HealthCheckpointTimeout = durationpb.New(t.Duration)
	}
	if t := s.Health.StartupTimeout; t != nil {
		p.HealthStartupTimeout = durationpb.New(t.Duration)
	}
	if pf := s.Health.Preflight; pf != nil {
		p.HealthPreflight = &rdzvv1.PreflightSpec{MinBandwidthMbps: pf.MinBandwidthMbps, Bytes: uint64(max(pf.Bytes, 0))}
		if pf.Timeout != nil {
			p.HealthPreflight.Timeout = durationpb.New(pf.Timeout.Duration)
		}
	}
	if s.Rendezvous.LastCall != nil {
		p.RendezvousLastCall = durationpb.New(s.Rendezvous.LastCall.Duration)
	}
	if s.Rendezvous.Timeout != nil {
		p.RendezvousTimeout = durationpb.New(s.Rendezvous.Timeout.Duration)
	}
	return p
}

// FromProto converts a request's spec and applies defaults, so the
// controller validates exactly what rdzvctl would have.
func FromProto(p *rdzvv1.JobSpec) *Spec {
	s := &Spec{
		Name:         p.GetName(),
		Nodes:        NodeRange{Min: int(p.GetNodesMin()), Max: int(p.GetNodesMax()), Spares: int(p.GetNodesSpares()), Grow: p.GetNodesGrow()},
		GPUsPerNode:  int(p.GetGpusPerNode()),
		ProcsPerNode: int(p.GetProcsPerNode()),
		Command:      p.GetCommand(),
		Workdir:      p.GetWorkdir(),
		Env:          p.GetEnv(),
		SecretEnv:    p.GetSecretEnv(),
		EnvFiles:     p.GetEnvFiles(),
		RunAs:        p.GetRunAs(),
		Selector:     p.GetSelector(),
		Checkpoint:   Checkpoint{Dir: p.GetCheckpointDir(), Markers: p.GetCheckpointMarkers()},
		Launcher: Launcher{Kind: p.GetLauncherKind(), KindReason: p.GetLauncherKindReason(), Torchrun: p.GetLauncherTorchrun(), Python: p.GetLauncherPython(), Module: p.GetLauncherModule(),
			Executable: p.GetLauncherExecutable(), Argv: p.GetLauncherArgv(), ExtraArgs: p.GetLauncherExtraArgs(),
			Preload: p.GetLauncherPreload()},
	}
	if m := p.GetCheckpointMemory(); m != nil {
		// Beyond the bounds is invalid either way; clamped, Validate says so.
		s.Checkpoint.Memory = &MemoryCheckpoint{Replicas: int(min(m.GetReplicas(), 1<<20)), MaxBytes: int64(min(m.GetMaxBytes(), math.MaxInt64)),
			PersistEvery: int(min(m.GetPersistEvery(), 1<<30)), Replicated: m.GetReplicated()}
	}
	if p.RendezvousLastCall != nil {
		s.Rendezvous.LastCall = wire.Dur(p.RendezvousLastCall.AsDuration())
	}
	if p.RendezvousTimeout != nil {
		s.Rendezvous.Timeout = wire.Dur(p.RendezvousTimeout.AsDuration())
	}
	// A spec from rdzvctl always carries these (it defaults before sending);
	// proto3 cannot tell an explicit 0 from absent, so 0 is taken as given.
	restarts := int(p.GetRestartMaxRestarts())
	s.Restart.MaxRestarts = &restarts
	if p.RestartBackoffInitial != nil {
		s.Restart.Backoff.Initial = wire.Dur(p.RestartBackoffInitial.AsDuration())
	}
	if p.RestartBackoffMax != nil {
		s.Restart.Backoff.Max = wire.Dur(p.RestartBackoffMax.AsDuration())
	}
	if p.HealthProgressTimeout != nil {
		s.Health.ProgressTimeout = wire.Dur(p.HealthProgressTimeout.AsDuration())
	}
	if p.HealthCheckpointTimeout != nil {
		s.Health.CheckpointTimeout = wire.Dur(p.HealthCheckpointTimeout.AsDuration())
	}
	if p.HealthStartupTimeout != nil {
		s.Health.StartupTimeout = wire.Dur(p.HealthStartupTimeout.AsDuration())
	}
	if pf := p.GetHealthPreflight(); pf != nil {
		// Beyond MaxInt64 is invalid either way; clamped, Validate says so.
		s.Health.Preflight = &Preflight{MinBandwidthMbps: pf.GetMinBandwidthMbps(), Bytes: int64(min(pf.GetBytes(), math.MaxInt64))}
		if pf.Timeout != nil {
			s.Health.Preflight.Timeout = wire.Dur(pf.Timeout.AsDuration())
		}
	}
	s.Default()
	return s
}
