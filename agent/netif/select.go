package netif

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ErrNoInterface means no interface satisfies the selection rules.
var ErrNoInterface = errors.New("no usable network interface")

// SelectOptions carries what the agent knows about routing besides the
// interface list. Empty fields are ignored.
type SelectOptions struct {
	// Explicit is --nccl-interface. It overrides every other rule and may name
	// a loopback or virtual interface, but it must exist, be up and have an
	// IPv4 address.
	Explicit string
	// ControllerFacing is the interface the kernel routes to the controller
	// through.
	ControllerFacing string
	// DefaultRoute is the interface holding the default route.
	DefaultRoute string
}

// Choice is the selected interface, the address to advertise and why it won,
// so that the agent can log and report a decision users can argue with.
type Choice struct {
	Interface Interface
	// Address is IPv4: NCCL and Gloo bootstrap over IPv4 by default.
	Address netip.Addr
	Reason  string
}

// Select picks the interface for NCCL and Gloo. In order: the explicit
// interface; the controller-facing one; the default-route one; the best
// remaining non-loopback, non-virtual interface (RDMA-capable first, then
// fastest, then first by name); loopback. Only interfaces that are up and
// have a non-link-local IPv4 address are eligible.
func Select(ifaces []Interface, opts SelectOptions) (Choice, error) {
	if opts.Explicit != "" {
		return selectExplicit(ifaces, opts.Explicit)
	}

	// Routing hints are skipped when they point at loopback or a virtual
	// interface: a controller on 127.0.0.1 (single-machine demo) or behind
	// docker0 says nothing about how other nodes reach this one.
	for _, hint := range []struct{ name, reason string }{
		{opts.ControllerFacing, "routes to the controller"},
		{opts.DefaultRoute, "holds the default route"},
	} {
		if hint.name == "" {
			continue
		}
		i := slices.IndexFunc(ifaces, func(ifc Interface) bool { return ifc.Name == hint.name })
		if i < 0 || !routable(ifaces[i]) {
			continue
		}
		if addr, ok := eligible(ifaces[i]); ok {
			return Choice{Interface: ifaces[i], Address: addr, Reason: hint.reason}, nil
		}
	}

	if c, ok := best(ifaces, routable); ok {
		return c, nil
	}
	// Loopback only carries traffic when every rank is on this machine, which
	// is exactly the case where nothing else exists.
	if c, ok := best(ifaces, func(ifc Interface) bool { return ifc.Kind == KindLoopback }); ok {
		c.Reason = "loopback fallback: nothing else reaches the controller"
		return c, nil
	}
	return Choice{}, fmt.Errorf("%w: %s", ErrNoInterface, describeAll(ifaces))
}

func selectExplicit(ifaces []Interface, name string) (Choice, error) {
	i := slices.IndexFunc(ifaces, func(ifc Interface) bool { return ifc.Name == name })
	var problem string
	switch {
	case i < 0:
		problem = "does not exist"
	case !ifaces[i].Up:
		problem = "is down"
	default:
		if addr, ok := ifaces[i].ipv4(); ok {
			return Choice{Interface: ifaces[i], Address: addr, Reason: "explicit --nccl-interface"}, nil
		}
		problem = "has no ipv4 address"
	}
	return Choice{}, fmt.Errorf("%w: --nccl-interface %s %s (usable: %s)", ErrNoInterface, name, problem, describeUsable(ifaces))
}

// best returns the preferred eligible interface among those keep accepts.
func best(ifaces []Interface, keep func(Interface) bool) (Choice, bool) {
	var cands []Choice
	for _, ifc := range ifaces {
		if addr, ok := eligible(ifc); ok && keep(ifc) {
			cands = append(cands, Choice{Interface: ifc, Address: addr})
		}
	}
	if len(cands) == 0 {
		return Choice{}, false
	}
	slices.SortFunc(cands, func(a, b Choice) int { return preference(a.Interface, b.Interface) })
	c := cands[0]
	c.Reason = "only usable interface"
	if len(cands) > 1 {
		c.Reason = fmt.Sprintf("best of %d usable interfaces (rdma, then link speed, then name)", len(cands))
	}
	return c, true
}

// preference orders RDMA-capable interfaces first because they sit on the
// fabric GPUs talk over, then faster links, then names for determinism.
func preference(a, b Interface) int {
	if a.rdma() != b.rdma() {
		if a.rdma() {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(b.SpeedMbps, a.SpeedMbps); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

func eligible(ifc Interface) (netip.Addr, bool) {
	if !ifc.Up {
		return netip.Addr{}, false
	}
	return ifc.ipv4()
}

func routable(ifc Interface) bool {
	return ifc.Kind != KindLoopback && ifc.Kind != KindVirtual
}

func describeUsable(ifaces []Interface) string {
	var usable []string
	for _, ifc := range sortedByName(ifaces) {
		if addr, ok := eligible(ifc); ok {
			usable = append(usable, fmt.Sprintf("%s %s", ifc.Name, addr))
		}
	}
	if len(usable) == 0 {
		return "none"
	}
	return strings.Join(usable, ", ")
}

// describeAll says why each interface was passed over, for the error a user
// reads when selection fails.
func describeAll(ifaces []Interface) string {
	if len(ifaces) == 0 {
		return "no interfaces found"
	}
	descs := make([]string, 0, len(ifaces))
	for _, ifc := range sortedByName(ifaces) {
		state := ifc.Kind.String()
		if !ifc.Up {
			state += ", down"
		} else if _, ok := ifc.ipv4(); !ok {
			state += ", no ipv4"
		}
		descs = append(descs, fmt.Sprintf("%s (%s)", ifc.Name, state))
	}
	return "considered " + strings.Join(descs, ", ")
}

func sortedByName(ifaces []Interface) []Interface {
	return slices.SortedFunc(slices.Values(ifaces), func(a, b Interface) int {
		return strings.Compare(a.Name, b.Name)
	})
}
