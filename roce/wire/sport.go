package wire

// UDPSrcPortMin is the smallest UDP source port of the Linux convention:
// source ports are chosen in [0xC000, 0xFFFF], the dynamic port range.
const UDPSrcPortMin = 0xc000

// FlowLabelMask masks a uint32 to the 20 bits of an IPv6 flow label.
const FlowLabelMask = 0xfffff

// FlowLabelToUDPSrcPort derives a RoCEv2 UDP source port from a 20-bit
// flow label, as Linux RoCE drivers do (rdma_flow_label_to_udp_sport):
// the top six bits of the label are folded into the low 14 bits, and the
// result is placed in the range [UDPSrcPortMin, 0xFFFF]. Equal flow labels
// give equal ports, so a flow keeps one ECMP path.
func FlowLabelToUDPSrcPort(fl uint32) uint16 {
	lo := fl & 0x3fff
	hi := fl & 0xfc000
	lo ^= hi >> 14
	return uint16(lo | UDPSrcPortMin)
}

// CalcFlowLabel derives a 20-bit flow label from the local and remote QP
// numbers, as Linux does when an address handle has none
// (rdma_calc_flow_label): it folds the 48-bit product of the two 24-bit
// QPNs into 20 bits. The result is symmetric, so both ends of a
// connection compute the same label.
func CalcFlowLabel(lqpn, rqpn uint32) uint32 {
	v := uint64(lqpn) * uint64(rqpn)
	v ^= v >> 20
	v ^= v >> 40
	return uint32(v & FlowLabelMask)
}

// UDPSrcPort returns the UDP source port Linux uses for a RoCEv2 flow
// (rdma_get_udp_sport): it is derived from the flow label fl, or, if fl
// is zero, from a flow label computed from the QP numbers.
func UDPSrcPort(fl, lqpn, rqpn uint32) uint16 {
	if fl == 0 {
		fl = CalcFlowLabel(lqpn, rqpn)
	}
	return FlowLabelToUDPSrcPort(fl)
}
