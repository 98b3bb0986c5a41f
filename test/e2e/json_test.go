package e2e

import "time"

// The shapes of `rdzvctl ... -o json`: protobuf field names, every field
// present, 64-bit integers as strings. Decoding into our own structs rather
// than the generated types keeps the test tied to the output operators and
// scripts see.

type nodeJSON struct {
	Info struct {
		Name                string `json:"name"`
		NcclInterface       string `json:"nccl_interface"`
		NcclInterfaceReason string `json:"nccl_interface_reason"`
		Address             string `json:"address"`
		FakeGpus            bool   `json:"fake_gpus"`
		Gpus                []any  `json:"gpus"`
	} `json:"info"`
	State         string    `json:"state"`
	Job           string    `json:"job"`
	Generation    uint64    `json:"generation,string"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	Cordoned      bool      `json:"cordoned"`
}

type jobJSON struct {
	Spec struct {
		Name         string `json:"name"`
		NodesMin     int    `json:"nodes_min"`
		NodesMax     int    `json:"nodes_max"`
		ProcsPerNode int    `json:"procs_per_node"`
	} `json:"spec"`
	State       string           `json:"state"`
	Reason      string           `json:"reason"`
	Generation  uint64           `json:"generation,string"`
	MasterAddr  string           `json:"master_addr"`
	MasterPort  int              `json:"master_port"`
	Assignments []assignmentJSON `json:"assignments"`
	CreatedAt   time.Time        `json:"created_at"`
	StartedAt   time.Time        `json:"started_at"`
	FinishedAt  time.Time        `json:"finished_at"`
	Restarts    int              `json:"restarts"`
	// Nil until a checkpoint is recorded.
	LatestCheckpoint *checkpointJSON `json:"latest_checkpoint"`
	// Durations as protojson writes them ("1.5s"), nil when unset.
	TrainingTime *string `json:"training_time"`
	RecoveryTime *string `json:"recovery_time"`
	// The highest step reported, the training phase and the latest
	// metrics, numbers or "NaN".
	Step    uint64         `json:"step,string"`
	Phase   string         `json:"phase"`
	Metrics map[string]any `json:"metrics"`
}

type checkpointJSON struct {
	Step       uint64 `json:"step,string"`
	Path       string `json:"path"`
	Generation uint64 `json:"generation,string"`
	Node       string `json:"node"`
	Source     string `json:"source"`
}

type assignmentJSON struct {
	Node          string `json:"node"`
	NodeRank      int    `json:"node_rank"`
	Address       string `json:"address"`
	NcclInterface string `json:"nccl_interface"`
	State         string `json:"state"`
	// Pointers, so that a missing field is not mistaken for exit code 0.
	ExitCode *int    `json:"exit_code"`
	Signal   *string `json:"signal"`
	Message  string  `json:"message"`
}

type eventJSON struct {
	Time       time.Time `json:"time"`
	Job        string    `json:"job"`
	Node       string    `json:"node"`
	Generation uint64    `json:"generation,string"`
	Kind       string    `json:"kind"`
	Message    string    `json:"message"`
	// Set on failures: a duration as protojson writes it ("0.120s").
	DetectionLatency *string `json:"detection_latency"`
}
