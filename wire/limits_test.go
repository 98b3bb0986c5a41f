package wire

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestClipText(t *testing.T) {
	require.Equal(t, "short", ClipText("short"))
	exact := strings.Repeat("x", MaxTextBytes)
	require.Equal(t, exact, ClipText(exact))
	// A multi-byte character straddling the cut is dropped whole.
	long := strings.Repeat("x", MaxTextBytes-4) + strings.Repeat("é", 10)
	clipped := ClipText(long)
	require.LessOrEqual(t, len(clipped), MaxTextBytes)
	require.True(t, utf8.ValidString(clipped))
	require.True(t, strings.HasSuffix(clipped, "..."))
}
