// Package appliance is taproce's daemon side: ports (a TAP device, a
// station and fault injection per network namespace), and later the local
// switch, the transport engines and the control server that wire them to
// applications.
package appliance
