package controller

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/internal/httpserve"
	"github.com/rdzv/rdzv/pki"
	"github.com/rdzv/rdzv/wire"
	"github.com/rdzv/rdzv/wire/yamlcheck"
)

// Config is the controller's configuration (deploy/config/controller.yaml).
type Config struct {
	// Listen is the gRPC address agents and rdzvctl connect to.
	Listen string `json:"listen"`
	// AdvertiseAddr is the host:port other controllers send agents and
	// rdzvctl to while this one leads. Empty: Listen, when that names a
	// specific host; it is never derived from the hostname.
	AdvertiseAddr string `json:"advertise_addr"`
	// LeaderLeaseTTL is how long a leader that stopped renewing its etcd
	// lease (crashed, cut off) keeps the lead before a follower takes over.
	// etcd leases have whole seconds; it is rounded up.
	LeaderLeaseTTL wire.Duration `json:"leader_lease_ttl"`
	// DataDir holds the embedded etcd's data and its only listener, the
	// Unix socket EmbeddedEtcdSocket; it is kept private to the controller
	// (0700). Unused with external etcd.
	DataDir string `json:"data_dir"`
	// SecretsKeyFile is the keyring that seals jobs' secret_env values in
	// etcd (controller/keyring). Empty: SecretsKeyPath's default, created
	// on first start with embedded etcd. Every replica needs the same file.
	SecretsKeyFile string          `json:"secrets_key_file"`
	Etcd           EtcdConfig      `json:"etcd"`
	Heartbeat      HeartbeatConfig `json:"heartbeat"`
	// MasterPortRange is where torchrun's master port is picked; the rank 0
	// node's agent confirms the port is free before the round commits.
	MasterPortRange PortRange `json:"master_port_range"`
	// FlakyNodes cordons a node that keeps failing the jobs it runs.
	FlakyNodes FlakyNodesConfig `json:"flaky_nodes"`
	Limits     LimitsConfig     `json:"limits"`
	Retention  RetentionConfig  `json:"retention"`
	LogLevel   string           `json:"log_level"`
	// TLS is the controller's certificate (role controller) and the cluster
	// CA that agents' and operators' certificates must chain to.
	TLS TLSConfig `json:"tls"`
	// Insecure serves without TLS and without authentication: anyone who
	// reaches Listen can run commands on every node. Local tests only.
	Insecure bool `json:"insecure"`
	// HTTP serves /metrics, /healthz and /readyz (docs/monitoring.md);
	// loopback by default, off when its listen is empty.
	HTTP httpserve.Config `json:"http"`
}

// TLSConfig is the controller's TLS files and how it keeps checking the
// certificates of open connections.
type TLSConfig struct {
	pki.Files
	// ReverifyInterval is how often every open connection's client
	// certificate is verified again, against the CA as loaded now and the
	// deny-list (rdzvctl pki revoke). Connections are also checked at once
	// when either changes; this bounds how long a connection outlives a
	// change that was missed (a CA file edited while no one connected).
	ReverifyInterval wire.Duration `json:"reverify_interval"`
	// MaxHandshakes is how many TLS handshakes run at once; more wait
	// their turn in arrival order (up to 15 s, then they go ahead without
	// one). It keeps a cold start of a large cluster, every agent
	// handshaking at once, from starving the heartbeats of the agents
	// already registered.
	MaxHandshakes int `json:"max_handshakes"`
}

// FlakyNodesConfig: a node lost this many times within Window while running
// a job is cordoned until an operator uncordons it. Losses are what is
// unambiguously the node's doing (heartbeats stopped, cut off, agent gone);
// a worker exiting non-zero is not counted, since when one node dies its
// peers' workers fail too, and a program's own bug fails the same rank on
// the same node every time.
type FlakyNodesConfig struct {
	// Losses is the threshold; 0 turns this off.
	Losses int           `json:"losses"`
	Window wire.Duration `json:"window"`
}

type EtcdConfig struct {
	// Endpoints of an external etcd cluster; empty runs an embedded one.
	Endpoints   []string      `json:"endpoints"`
	DialTimeout wire.Duration `json:"dial_timeout"`
	// RequestTimeout bounds each etcd request, so that a lost quorum fails
	// changes with an error instead of hanging them.
	RequestTimeout wire.Duration `json:"request_timeout"`
	// Client TLS to an external etcd: CAFile verifies the servers,
	// CertFile and KeyFile (both or neither) authenticate this controller.
	CAFile   string `json:"ca_file"`
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// CompactionInterval is how often the leader compacts etcd's history,
	// keeping about one interval of it; 0 leaves compaction to the etcd
	// servers' own --auto-compaction-* flags.
	CompactionInterval wire.Duration `json:"compaction_interval"`
	// MaxTxnOps is how many operations an external etcd accepts in one
	// transaction (its --max-txn-ops): the controller packs writes up to
	// it, so a burst of N worker reports is N/MaxTxnOps transactions. The
	// embedded etcd is started with EmbeddedMaxTxnOps instead.
	MaxTxnOps int `json:"max_txn_ops"`
}

// Bounds of etcd.max_txn_ops: the controller's largest single change has
// under ten operations, and a replay of events reads pages of more than
// one transaction's (store.ReplayEvents), which grow with it.
const (
	minMaxTxnOps = 16
	maxMaxTxnOps = 4096
)

// LimitsConfig bounds the work the controller takes on, so that no one's
// submissions, each within the input limits, add up to an etcd, a memory or
// an API that no longer serves everyone.
type LimitsConfig struct {
	// MaxActiveJobs bounds the jobs that have not finished (pending,
	// running, recovering, stopping); StartJob beyond it is refused.
	MaxActiveJobs int `json:"max_active_jobs"`
}

// RetentionConfig bounds what etcd keeps over months of operation.
type RetentionConfig struct {
	// Interval is how often the leader prunes.
	Interval wire.Duration `json:"interval"`
	// EventMaxAge: older events are deleted (job and cluster events).
	EventMaxAge wire.Duration `json:"event_max_age"`
	// MaxJobEvents and MaxClusterEvents keep at most this many newest
	// events per job and of the cluster.
	MaxJobEvents     int `json:"max_job_events"`
	MaxClusterEvents int `json:"max_cluster_events"`
	// FinishedJobMaxAge: a job finished longer ago is deleted with its
	// events, rounds and checkpoint catalog.
	FinishedJobMaxAge wire.Duration `json:"finished_job_max_age"`
	// MaxFinishedJobs keeps at most this many finished jobs, newest first.
	MaxFinishedJobs int `json:"max_finished_jobs"`
	// LostNodeMaxAge: a node lost for longer is deleted, unless it is
	// cordoned (the cordon is an operator's word, kept until lifted).
	LostNodeMaxAge wire.Duration `json:"lost_node_max_age"`
}

type HeartbeatConfig struct {
	// Interval is how often agents send a heartbeat.
	Interval wire.Duration `json:"interval"`
	// Timeout is how long without a heartbeat before a node is lost.
	Timeout wire.Duration `json:"timeout"`
	// VouchedTimeout is how long a node the controller does not hear, but
	// whose gossip peers still reach, keeps its job before it is declared
	// lost; its agent fences itself after as long without the controller.
	// It is also how long running jobs survive having no controller at all
	// (etcd quorum lost, every controller down).
	VouchedTimeout wire.Duration `json:"vouched_timeout"`
}

// policy is the heartbeat config as health's rules take it.
func (h HeartbeatConfig) policy() health.Heartbeat {
	return health.Heartbeat{Interval: h.Interval.Duration, Timeout: h.Timeout.Duration, Vouched: h.VouchedTimeout.Duration}
}

type PortRange struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// DefaultHTTPListen is the controller's metrics and health address.
const DefaultHTTPListen = "127.0.0.1:9401"

// DefaultConfig is a single controller with embedded etcd.
func DefaultConfig() Config {
	return Config{
		Listen:         "0.0.0.0:7070",
		DataDir:        "/var/lib/rdzv/controller",
		LeaderLeaseTTL: dur(5 * time.Second),
		Etcd: EtcdConfig{DialTimeout: dur(5 * time.Second), RequestTimeout: dur(5 * time.Second),
			CompactionInterval: dur(time.Hour), MaxTxnOps: store.DefaultMaxTxnOps},
		Heartbeat: HeartbeatConfig{Interval: dur(time.Second), Timeout: dur(5 * time.Second),
			VouchedTimeout: dur(time.Minute)},
		MasterPortRange: PortRange{Min: 29500, Max: 29999},
		FlakyNodes:      FlakyNodesConfig{Losses: 3, Window: wire.Duration{Duration: time.Hour}},
		// 256 specs of at most 512 KiB each are 128 MiB of etcd and memory;
		// the scheduler's pass is linear in the pending jobs.
		Limits: LimitsConfig{MaxActiveJobs: 256},
		Retention: RetentionConfig{
			Interval: dur(10 * time.Minute), EventMaxAge: dur(90 * 24 * time.Hour),
			MaxJobEvents: 5000, MaxClusterEvents: 20000,
			FinishedJobMaxAge: dur(30 * 24 * time.Hour), MaxFinishedJobs: 1000,
			// A week: a node down over a long weekend or waiting for a part
			// is still listed LOST when operators look; decommissioned and
			// renamed hosts do not pile up.
			LostNodeMaxAge: dur(7 * 24 * time.Hour),
		},
		// Enough turns to keep a cold start of the whole cluster fast, few
		// enough that the registered agents' heartbeats stay on time while
		// it runs; a turn is held while the agent computes its reply, so
		// more cores need more turns.
		TLS:      TLSConfig{ReverifyInterval: dur(time.Minute), MaxHandshakes: 256},
		LogLevel: "info",
		HTTP:     httpserve.Config{Listen: DefaultHTTPListen},
	}
}

func dur(d time.Duration) wire.Duration { return wire.Duration{Duration: d} }

// LoadConfig reads a YAML config file over DefaultConfig, strictly: an
// unknown field or a value of the wrong kind is an error at its line and
// column (wire/yamlcheck), so a typo never silently falls back to a
// default. It returns where each field is, for Validate's errors.
func LoadConfig(path string) (Config, yamlcheck.Positions, error) {
	return yamlcheck.LoadFile(path, DefaultConfig())
}

// maxTxnOps is how many operations the etcd in use accepts per transaction.
func (c Config) maxTxnOps() int {
	if c.Embedded() {
		return EmbeddedMaxTxnOps
	}
	return c.Etcd.MaxTxnOps
}

// Embedded reports whether the controller runs its own etcd.
func (c Config) Embedded() bool { return len(c.Etcd.Endpoints) == 0 }

// embeddedEtcdSocketName is the embedded etcd's client socket in DataDir.
const embeddedEtcdSocketName = "etcd.sock"

// maxSocketPath is the longest path a Unix socket can be bound to on Linux
// (sun_path holds 108 bytes with the terminating NUL).
const maxSocketPath = 107

// EmbeddedEtcdSocket is the Unix socket the embedded etcd serves clients
// on, and its only listener: no TCP port, so only whoever can enter
// DataDir (the controller's user, and root) reaches it. Use it with
// etcdctl --endpoints unix://PATH.
func (c Config) EmbeddedEtcdSocket() string {
	return filepath.Join(c.DataDir, embeddedEtcdSocketName)
}

// defaultSecretsKeyName is the keyring in DataDir when SecretsKeyFile is
// not set.
const defaultSecretsKeyName = "secrets.key"

// SecretsKeyPath is the keyring file: SecretsKeyFile, else
// DataDir/secrets.key.
func (c Config) SecretsKeyPath() string {
	if c.SecretsKeyFile != "" {
		return c.SecretsKeyFile
	}
	return filepath.Join(c.DataDir, defaultSecretsKeyName)
}

// Advertised is the address this controller campaigns with: what other
// controllers redirect clients to while it leads.
func (c Config) Advertised() string {
	if c.AdvertiseAddr != "" {
		return c.AdvertiseAddr
	}
	return c.Listen
}

// wildcardHost reports whether host does not name one reachable host.
func wildcardHost(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::" || host == "[::]"
}

// Validate names the first problem per field.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen: %q is not host:port: %w", c.Listen, err))
	}
	if c.AdvertiseAddr != "" {
		if host, _, err := net.SplitHostPort(c.AdvertiseAddr); err != nil || wildcardHost(host) {
			errs = append(errs, wire.Fieldf("advertise_addr", "%q is not a host:port that clients can dial", c.AdvertiseAddr))
		}
	} else if host, _, err := net.SplitHostPort(c.Listen); err == nil && wildcardHost(host) && !c.Embedded() {
		// With replicas, followers send clients to the leader's advertised
		// address; a wildcard cannot be dialled and a hostname guess may be
		// wrong, so it must be given.
		errs = append(errs, wire.Fieldf("advertise_addr", "required with external etcd when listen (%s) is a wildcard address: set the host:port agents and rdzvctl reach this controller at", c.Listen))
	}
	if c.LeaderLeaseTTL.Duration < 2*time.Second {
		errs = append(errs, wire.Fieldf("leader_lease_ttl", "must be at least 2s, got %s", c.LeaderLeaseTTL))
	}
	if c.Embedded() {
		if c.DataDir == "" {
			errs = append(errs, wire.Fieldf("data_dir", "required with embedded etcd"))
		}
		if sock, err := filepath.Abs(c.EmbeddedEtcdSocket()); err == nil && c.DataDir != "" && len(sock) > maxSocketPath {
			errs = append(errs, wire.Fieldf("data_dir", "%q is too long: the embedded etcd's socket %s must be at most %d bytes, got %d",
				c.DataDir, sock, maxSocketPath, len(sock)))
		}
	}
	if !c.Embedded() && c.SecretsKeyFile == "" && c.DataDir == "" {
		errs = append(errs, wire.Fieldf("secrets_key_file", "required with external etcd when data_dir is empty (the default is data_dir/secrets.key)"))
	}
	if c.Etcd.DialTimeout.Duration <= 0 {
		errs = append(errs, wire.Fieldf("etcd.dial_timeout", "must be positive, got %s", c.Etcd.DialTimeout))
	}
	if c.Etcd.RequestTimeout.Duration <= 0 {
		errs = append(errs, wire.Fieldf("etcd.request_timeout", "must be positive, got %s", c.Etcd.RequestTimeout))
	}
	if (c.Etcd.CertFile == "") != (c.Etcd.KeyFile == "") {
		errs = append(errs, fmt.Errorf("etcd.cert_file, etcd.key_file: give both or neither, got cert %q and key %q", c.Etcd.CertFile, c.Etcd.KeyFile))
	}
	if c.Embedded() && (c.Etcd.CAFile != "" || c.Etcd.CertFile != "") {
		errs = append(errs, errors.New("etcd.ca_file, etcd.cert_file: client TLS applies to an external etcd only; set etcd.endpoints"))
	}
	if c.Etcd.CompactionInterval.Duration < 0 {
		errs = append(errs, wire.Fieldf("etcd.compaction_interval", "must be 0 (off) or positive, got %s", c.Etcd.CompactionInterval))
	}
	switch n := c.Etcd.MaxTxnOps; {
	case n < minMaxTxnOps || n > maxMaxTxnOps:
		errs = append(errs, wire.Fieldf("etcd.max_txn_ops", "must be between %d and %d (at most the etcd servers' --max-txn-ops, default %d), got %d",
			minMaxTxnOps, maxMaxTxnOps, store.DefaultMaxTxnOps, n))
	case c.Embedded() && n != store.DefaultMaxTxnOps:
		errs = append(errs, wire.Fieldf("etcd.max_txn_ops", "applies to an external etcd only (the embedded etcd takes %d); set etcd.endpoints, or leave it at %d, got %d",
			EmbeddedMaxTxnOps, store.DefaultMaxTxnOps, n))
	}
	r := c.Retention
	if r.Interval.Duration <= 0 {
		errs = append(errs, wire.Fieldf("retention.interval", "must be positive, got %s", r.Interval))
	}
	for field, d := range map[string]wire.Duration{"retention.event_max_age": r.EventMaxAge, "retention.finished_job_max_age": r.FinishedJobMaxAge,
		"retention.lost_node_max_age": r.LostNodeMaxAge} {
		if d.Duration <= 0 {
			errs = append(errs, wire.Fieldf(field, "must be positive, got %s", d))
		}
	}
	for field, n := range map[string]int{"retention.max_job_events": r.MaxJobEvents, "retention.max_cluster_events": r.MaxClusterEvents, "retention.max_finished_jobs": r.MaxFinishedJobs} {
		if n < 1 {
			errs = append(errs, wire.Fieldf(field, "must be at least 1, got %d", n))
		}
	}
	if c.Limits.MaxActiveJobs < 1 {
		errs = append(errs, wire.Fieldf("limits.max_active_jobs", "must be at least 1, got %d", c.Limits.MaxActiveJobs))
	}
	if c.Heartbeat.Interval.Duration <= 0 {
		errs = append(errs, wire.Fieldf("heartbeat.interval", "must be positive, got %s", c.Heartbeat.Interval))
	}
	if c.Heartbeat.Timeout.Duration < 2*c.Heartbeat.Interval.Duration {
		errs = append(errs, wire.Fieldf("heartbeat.timeout", "must be at least twice heartbeat.interval (%s), got %s", c.Heartbeat.Interval, c.Heartbeat.Timeout))
	}
	if !c.Insecure {
		if err := c.TLS.Validate("tls"); err != nil {
			errs = append(errs, err)
		}
		if c.TLS.ReverifyInterval.Duration <= 0 {
			errs = append(errs, wire.Fieldf("tls.reverify_interval", "must be positive, got %s", c.TLS.ReverifyInterval))
		}
		if c.TLS.MaxHandshakes < 1 {
			errs = append(errs, wire.Fieldf("tls.max_handshakes", "must be at least 1, got %d", c.TLS.MaxHandshakes))
		}
	}
	if c.Heartbeat.VouchedTimeout.Duration < c.Heartbeat.Timeout.Duration {
		errs = append(errs, wire.Fieldf("heartbeat.vouched_timeout", "must be at least heartbeat.timeout (%s), got %s", c.Heartbeat.Timeout, c.Heartbeat.VouchedTimeout))
	}
	if r := c.MasterPortRange; r.Min < 1024 || r.Max > 65535 || r.Min > r.Max {
		errs = append(errs, wire.Fieldf("master_port_range", "want 1024 <= min <= max <= 65535, got %d-%d", r.Min, r.Max))
	}
	if err := c.HTTP.Validate("http"); err != nil {
		errs = append(errs, err)
	}
	if c.FlakyNodes.Losses < 0 {
		errs = append(errs, wire.Fieldf("flaky_nodes.losses", "must be 0 (off) or more, got %d", c.FlakyNodes.Losses))
	}
	if c.FlakyNodes.Losses > 0 && c.FlakyNodes.Window.Duration <= 0 {
		errs = append(errs, wire.Fieldf("flaky_nodes.window", "must be positive, got %s", c.FlakyNodes.Window))
	}
	return errors.Join(errs...)
}
