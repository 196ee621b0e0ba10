/* Prints every answer of libibverbs' pure functions — the names of
 * statuses, events, node types and port states, and the rate
 * conversions — over their whole ranges and beyond. Run once on Debian's
 * libibverbs and once on taproce's, the outputs must be equal. */
#include <infiniband/verbs.h>
#include <stdio.h>

int main(void)
{
	for (int i = -1; i < 40; i++)
		printf("wc_status %d %s\n", i, ibv_wc_status_str((enum ibv_wc_status)i));
	for (int i = -1; i < 40; i++)
		printf("event %d %s\n", i, ibv_event_type_str((enum ibv_event_type)i));
	for (int i = -1; i < 12; i++)
		printf("node %d %s\n", i, ibv_node_type_str((enum ibv_node_type)i));
	for (int i = -1; i < 10; i++)
		printf("port_state %d %s\n", i, ibv_port_state_str((enum ibv_port_state)i));
	for (int i = -1; i < 30; i++)
		printf("rate %d mult %d mbps %d\n", i, ibv_rate_to_mult((enum ibv_rate)i), ibv_rate_to_mbps((enum ibv_rate)i));
	for (int m = -1; m < 1000; m++)
		printf("mult %d rate %d\n", m, mult_to_ibv_rate(m));
	int mbps[] = {-1, 0, 1, 2500, 5000, 10000, 14062, 20000, 25781, 30000, 40000, 51562, 56250, 60000, 80000,
		      100000, 103125, 112500, 120000, 150000, 168750, 200000, 206250, 225000, 300000, 400000, 600000,
		      800000, 1200000, 12345};
	for (unsigned i = 0; i < sizeof(mbps) / sizeof(mbps[0]); i++)
		printf("mbps %d rate %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
	return 0;
}
