package health

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCritical(t *testing.T) {
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
		{"uncorrectable ecc", Fault{Kind: ECCUncorrectable, Code: 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.fault.Critical())
		})
	}
}

func TestString(t *testing.T) {
	require.Equal(t, "GPU 3 (GPU-abc): XID 79", Fault{GPUIndex: 3, UUID: "GPU-abc", Kind: XID, Code: 79}.String())
	require.Equal(t, "GPU 0 (GPU-x): uncorrectable ECC error", Fault{UUID: "GPU-x", Kind: ECCUncorrectable, Code: 2}.String())
}
