package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/taproce/taproce/verbs"
)

// applianceHint says how to get an appliance to a user whose command found
// none: the one place it is worded, under every verbs client's error.
const applianceHint = "Start one with `taproce run --config FILE`, or a lab with `taproce lab --keep`\n" +
	"(which prints the TAPROCE_SOCKET to use), or set TAPROCE_SOCKET to the socket\n" +
	"of a running appliance.\n"

// printError writes err as the error of command cmd: "taproce CMD: ERR".
// When the command found no appliance, it says instead where it looked and
// how to get one (applianceHint), whatever the command was doing then.
func printError(w io.Writer, cmd string, err error) {
	var na *verbs.NoApplianceError
	if errors.As(err, &na) {
		fmt.Fprintf(w, "taproce %s: no appliance is listening at %s\n%s", cmd, na.Socket, applianceHint)
		return
	}
	fmt.Fprintf(w, "taproce %s: %v\n", cmd, err)
}
