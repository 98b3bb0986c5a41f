package agent

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

var errNoFreePort = errors.New("no free port")

// maxProbes bounds one probe; a range that crowded is an operator problem
// the error names.
const maxProbes = 64

// probePort finds a port in the requested range that can be bound on every
// address, which is how torchrun's store listens. Ports are tried in random
// order so concurrent jobs on one master rarely race for the same one.
func probePort(req *rdzvv1.PortProbe) *rdzvv1.PortProbeResult {
	res := &rdzvv1.PortProbeResult{RequestId: req.GetRequestId()}
	lo, hi := int(req.GetPortMin()), int(req.GetPortMax())
	if lo < 1 || hi > 65535 || lo > hi {
		res.Error = fmt.Sprintf("invalid port range %d-%d", lo, hi)
		return res
	}
	span := hi - lo + 1
	tries := min(span, maxProbes)
	start := rand.N(span)
	for i := range tries {
		port := lo + (start+i)%span
		l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		_ = l.Close()
		res.Port = uint32(port)
		return res
	}
	res.Error = fmt.Sprintf("%v: tried %d ports in %d-%d", errNoFreePort, tries, lo, hi)
	return res
}
