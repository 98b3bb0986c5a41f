package netif

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SystemDetector reads this machine's interfaces and routes. The zero value
// reads /sys and /proc; tests point the roots at fake trees.
type SystemDetector struct {
	SysRoot  string
	ProcRoot string
}

// arphrdInfiniBand is ARPHRD_INFINIBAND from <linux/if_arp.h>, the value of
// /sys/class/net/<if>/type for IPoIB interfaces.
const arphrdInfiniBand = 32

// Route flags from <linux/route.h>.
const (
	rtfUp     = 0x0001
	rtfReject = 0x0200
)

// probePort is the discard port. Connecting a UDP socket needs a port, but
// nothing is ever sent to it.
const probePort = 9

// virtualPrefixes are names container runtimes, CNI plugins, hypervisors and
// tunnels give their interfaces. veth is here for the host side of a pair;
// the side moved into a namespace is normally renamed (eth0) and so escapes
// this list, which is what keeps it selectable.
var virtualPrefixes = []string{
	"docker", "br-", "virbr", "vnet", "veth", "cni", "flannel", "cali",
	"cilium", "weave", "vxlan", "genev", "kube-", "nodelocaldns", "lxc",
	"podman", "ovs-", "tun", "tap", "dummy", "ifb",
}

func hasVirtualPrefix(name string) bool {
	for _, p := range virtualPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func (d *SystemDetector) sysRoot() string {
	if d.SysRoot == "" {
		return "/sys"
	}
	return d.SysRoot
}

func (d *SystemDetector) procRoot() string {
	if d.ProcRoot == "" {
		return "/proc"
	}
	return d.ProcRoot
}

func (d *SystemDetector) netDir(name string) string {
	return filepath.Join(d.sysRoot(), "class", "net", name)
}

// Interfaces lists the interfaces the kernel reports, classified and
// enriched from sysfs.
func (d *SystemDetector) Interfaces() ([]Interface, error) {
	nifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %w", err)
	}
	ifaces := make([]Interface, 0, len(nifs))
	for _, n := range nifs {
		addrs, err := n.Addrs()
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", n.Name, err)
		}
		ifc := Interface{
			Name:  n.Name,
			Index: n.Index,
			Up:    n.Flags&net.FlagUp != 0 && n.Flags&net.FlagRunning != 0,
			MTU:   n.MTU,
			Addrs: prefixes(addrs),
		}
		if n.Flags&net.FlagLoopback != 0 {
			ifc.Kind = KindLoopback
		}
		d.enrich(&ifc)
		ifaces = append(ifaces, ifc)
	}
	return ifaces, nil
}

// enrich fills Kind (unless already loopback), SpeedMbps and RDMADevices
// from sysfs. Unreadable files leave the zero values: sysfs contents vary by
// driver and kernel, and a missing speed must not hide an interface.
func (d *SystemDetector) enrich(ifc *Interface) {
	if ifc.Kind != KindLoopback {
		ifc.Kind = d.classify(ifc.Name)
	}
	// Links without carrier and virtual links report -1 or fail with EINVAL.
	if speed, err := readInt(filepath.Join(d.netDir(ifc.Name), "speed")); err == nil && speed > 0 {
		ifc.SpeedMbps = speed
	}
	ifc.RDMADevices = d.rdmaDevices(ifc.Name)
}

// classify decides the Kind of a non-loopback interface.
//
// Physical NICs and SR-IOV functions have a "device" link to their bus
// device; virtual interfaces do not. A missing link alone does not make an
// interface virtual, though: bonds and VLANs lack it, and so does the veth
// a container or test-host network namespace sees as eth0, which is that
// namespace's only way out. So an interface without the link is virtual only
// if it is a bridge that enslaves nothing but virtual ports (docker0, cni0,
// virbr0), or carries a name container and VPN tooling uses. A bridge
// enslaving a NIC or bond (br0 on a hypervisor host) holds the host's address
// and counts as Ethernet.
func (d *SystemDetector) classify(name string) Kind {
	dir := d.netDir(name)
	if typ, err := readInt(filepath.Join(dir, "type")); err == nil && typ == arphrdInfiniBand {
		return KindInfiniBand
	}
	if exists(filepath.Join(dir, "device")) {
		return KindEthernet
	}
	if fi, err := os.Stat(filepath.Join(dir, "bridge")); err == nil && fi.IsDir() {
		if d.bridgesUplink(dir) {
			return KindEthernet
		}
		return KindVirtual
	}
	if hasVirtualPrefix(name) {
		return KindVirtual
	}
	if !exists(dir) {
		return KindUnknown
	}
	return KindEthernet
}

// bridgesUplink reports whether the bridge in bridgeDir enslaves a port that
// is not itself virtual. Ports are judged without recursing: the kernel
// refuses to enslave a bridge to a bridge.
func (d *SystemDetector) bridgesUplink(bridgeDir string) bool {
	ports, err := os.ReadDir(filepath.Join(bridgeDir, "brif"))
	if err != nil {
		return false
	}
	for _, p := range ports {
		dir := d.netDir(p.Name())
		if exists(filepath.Join(dir, "device")) || exists(dir) && !hasVirtualPrefix(p.Name()) {
			return true
		}
	}
	return false
}

// rdmaDevices lists the RDMA devices whose PCI function carries the
// interface: the RoCE netdev of a NIC, or the IPoIB netdev of an HCA.
func (d *SystemDetector) rdmaDevices(name string) []string {
	ibDir := filepath.Join(d.sysRoot(), "class", "infiniband")
	devs, err := os.ReadDir(ibDir)
	if err != nil {
		// No RDMA stack loaded: nothing to report.
		return nil
	}
	var rdma []string
	for _, dev := range devs {
		if exists(filepath.Join(ibDir, dev.Name(), "device", "net", name)) {
			rdma = append(rdma, dev.Name())
		}
	}
	return rdma
}

// DefaultRouteInterface returns the interface of the lowest-metric IPv4
// default route in the main routing table, or "" when there is none.
func (d *SystemDetector) DefaultRouteInterface() (string, error) {
	path := filepath.Join(d.procRoot(), "net", "route")
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading ipv4 routes: %w", err)
	}
	defer f.Close()
	name, err := parseDefaultRoute(f)
	if err != nil {
		return "", fmt.Errorf("parsing %s: %w", path, err)
	}
	return name, nil
}

// parseDefaultRoute reads the /proc/net/route format: a header line, then
// whitespace-separated fields Iface, Destination, Gateway, Flags, RefCnt,
// Use, Metric, Mask, ... with addresses and flags in hex.
func parseDefaultRoute(r io.Reader) (string, error) {
	best, bestMetric := "", 0
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if line == 1 || len(fields) == 0 {
			continue
		}
		if len(fields) < 8 {
			return "", fmt.Errorf("line %d: want at least 8 fields, got %d", line, len(fields))
		}
		// The mask matters as well as the destination: VPNs install
		// 0.0.0.0/1 to override the default route without replacing it.
		if fields[1] != "00000000" || fields[7] != "00000000" {
			continue
		}
		flags, err := strconv.ParseUint(fields[3], 16, 32)
		if err != nil {
			return "", fmt.Errorf("line %d: flags %q: %w", line, fields[3], err)
		}
		// An "unreachable default" route is listed with no usable interface.
		if flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		metric, err := strconv.Atoi(fields[6])
		if err != nil {
			return "", fmt.Errorf("line %d: metric %q: %w", line, fields[6], err)
		}
		if best == "" || metric < bestMetric {
			best, bestMetric = fields[0], metric
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("reading routes: %w", err)
	}
	return best, nil
}

// InterfaceFacing returns the interface the kernel would send packets to
// target through. target is an IP literal or "host:port"; a host name is
// resolved with net.ResolveUDPAddr. Connecting a UDP socket only asks the
// kernel for a route and a source address: no packet leaves the machine.
func (d *SystemDetector) InterfaceFacing(target string) (string, error) {
	raddr, err := resolveTarget(target)
	if err != nil {
		return "", fmt.Errorf("resolving %q: %w", target, err)
	}
	conn, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return "", fmt.Errorf("finding route to %s: %w", raddr, err)
	}
	local := conn.LocalAddr()
	if err := conn.Close(); err != nil {
		return "", fmt.Errorf("closing route probe to %s: %w", raddr, err)
	}
	laddr, ok := local.(*net.UDPAddr)
	if !ok {
		return "", fmt.Errorf("finding route to %s: unexpected local address %v", raddr, local)
	}
	name, err := interfaceWithAddr(laddr.AddrPort().Addr().Unmap().WithZone(""))
	if err != nil {
		return "", fmt.Errorf("finding interface facing %s: %w", raddr, err)
	}
	return name, nil
}

func resolveTarget(target string) (*net.UDPAddr, error) {
	if ip, err := netip.ParseAddr(target); err == nil {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, probePort)), nil
	}
	return net.ResolveUDPAddr("udp", target)
}

func interfaceWithAddr(addr netip.Addr) (string, error) {
	nifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("listing network interfaces: %w", err)
	}
	for _, n := range nifs {
		addrs, err := n.Addrs()
		if err != nil {
			return "", fmt.Errorf("listing addresses of %s: %w", n.Name, err)
		}
		for _, p := range prefixes(addrs) {
			if p.Addr() == addr {
				return n.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface holds %s", addr)
}

// prefixes converts the standard library's addresses, going through their
// string form because IPv4 ones may carry 16-byte IPs with 4-byte masks.
func prefixes(addrs []net.Addr) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if p, err := netip.ParsePrefix(ipn.String()); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
