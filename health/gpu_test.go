package health

import (
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

func policy(t *testing.T, c GPUConfig) XIDPolicy {
	t.Helper()
	p, err := c.Policy("gpu_health")
	require.NoError(t, err)
	return p
}

func TestCriticalByDefault(t *testing.T) {
	tests := []struct {
		name  string
		fault Fault
		want  bool
	}{
		{"xid 79 fallen off the bus", Fault{Kind: XID, Code: 79}, true},
		{"xid 48 double-bit ecc", Fault{Kind: XID, Code: 48}, true},
		{"xid 13 is the program's fault", Fault{Kind: XID, Code: 13}, false},
		{"xid 31 page fault is the program's", Fault{Kind: XID, Code: 31}, false},
		{"xid 43 stopped processing", Fault{Kind: XID, Code: 43}, false},
		{"xid 109 context switch timeout", Fault{Kind: XID, Code: 109}, false},
		{"uncorrectable ecc", Fault{Kind: ECCUncorrectable, Code: 1}, true},
	}
	p := policy(t, GPUConfig{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, p.Critical(tt.fault))
		})
	}
}

func TestCriticalByOperatorConfig(t *testing.T) {
	xid := func(code uint64) Fault { return Fault{Kind: XID, Code: code} }
	tests := []struct {
		name   string
		config string
		fault  Fault
		want   bool
	}{
		{"an ignored xid is only logged", "ignored_xids: [48, 74]", xid(74), false},
		{"ignoring adds to the defaults", "ignored_xids: [48]", xid(13), false},
		{"others stay critical", "ignored_xids: [48]", xid(79), true},
		{"quoted numbers are numbers", `ignored_xids: ["79"]`, xid(79), false},
		{"all ignores every xid", "ignored_xids: [all]", xid(79), false},
		{"all leaves uncorrectable ecc critical", "ignored_xids: [all]", Fault{Kind: ECCUncorrectable}, true},
		{"critical beats all", "{ignored_xids: [all], critical_xids: [79]}", xid(79), true},
		{"critical beats the defaults", "critical_xids: [43]", xid(43), true},
		{"critical leaves other defaults alone", "critical_xids: [43]", xid(13), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c GPUConfig
			require.NoError(t, yaml.UnmarshalStrict([]byte(tt.config), &c))
			require.Equal(t, tt.want, policy(t, c).Critical(tt.fault))
		})
	}
}

func TestGPUConfigRefusesBadXIDs(t *testing.T) {
	tests := []struct {
		name   string
		config GPUConfig
		want   string
	}{
		{"not a number", GPUConfig{IgnoredXIDs: []XIDEntry{"48", "xids"}}, `gpu_health.ignored_xids[1]: must be an XID number (1 or more) or "all", got "xids"`},
		{"zero", GPUConfig{IgnoredXIDs: []XIDEntry{"0"}}, `gpu_health.ignored_xids[0]: must be an XID number (1 or more) or "all", got "0"`},
		{"negative", GPUConfig{CriticalXIDs: []XIDEntry{"-4"}}, `gpu_health.critical_xids[0]: must be an XID number (1 or more), got "-4"`},
		{"all is not a critical xid", GPUConfig{CriticalXIDs: []XIDEntry{"all"}}, `gpu_health.critical_xids[0]: must be an XID number (1 or more), got "all"`},
		{"both lists", GPUConfig{IgnoredXIDs: []XIDEntry{"79"}, CriticalXIDs: []XIDEntry{"79"}}, "gpu_health.critical_xids[0]: XID 79 is also in gpu_health.ignored_xids; list it in one of them"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.config.Policy("gpu_health")
			require.EqualError(t, err, tt.want)
		})
	}
	var c GPUConfig
	require.ErrorContains(t, yaml.UnmarshalStrict([]byte("ignored_xids: [{a: 1}]"), &c), `want an XID number or "all"`)
}

func TestXIDPolicyString(t *testing.T) {
	require.Equal(t, "ignored xids: 13,31,43,45,48,68,109; critical xids: none; uncorrectable ecc: critical",
		policy(t, GPUConfig{IgnoredXIDs: []XIDEntry{"48"}}).String())
	require.Equal(t, "ignored xids: all; critical xids: 79; uncorrectable ecc: critical",
		policy(t, GPUConfig{IgnoredXIDs: []XIDEntry{"all"}, CriticalXIDs: []XIDEntry{"79"}}).String())
}

func TestString(t *testing.T) {
	require.Equal(t, "GPU 3 (GPU-abc): XID 79", Fault{GPUIndex: 3, UUID: "GPU-abc", Kind: XID, Code: 79}.String())
	require.Equal(t, "GPU 0 (GPU-x): uncorrectable ECC error", Fault{UUID: "GPU-x", Kind: ECCUncorrectable, Code: 2}.String())
}
