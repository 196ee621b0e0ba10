/* Prints what ibv_get_sysfs_path and ibv_read_sysfs_file answer for files
 * of every shape (a final newline or none, empty, exactly the buffer's
 * size, missing, a directory), so that the answers of two libraries can
 * be compared: rdma-core's and taproce's. Usage: sysfs DIR */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

/* Exported by libibverbs.so.1 (IBVERBS_1.0) and declared by rdma-core's
 * driver.h, which libibverbs-dev does not install: a program declares
 * them itself. */
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

static void write_file(const char *dir, const char *name, const char *body)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	if (f == NULL) {
		perror(path);
		return;
	}
	fputs(body, f);
	fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	const char *dir = argv[1];
	printf("sysfs path: \"%s\"\n", ibv_get_sysfs_path());
	write_file(dir, "newline", "4: ACTIVE\n");
	write_file(dir, "no-newline", "RoCE v2");
	write_file(dir, "empty", "");
	write_file(dir, "only-newline", "\n");
	write_file(dir, "fits-with-newline", "1234567\n");
	write_file(dir, "fills", "12345678");
	write_file(dir, "longer", "123456789abcdef\n");
	const char *files[] = {"newline", "no-newline", "empty", "only-newline", "fits-with-newline",
			       "fills", "longer", "missing", "."};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		for (size_t size = 8; size <= 64; size += 56) {
			char buf[64];
			memset(buf, 'X', sizeof(buf));
			int n = ibv_read_sysfs_file(dir, files[i], buf, size);
			printf("%s size %zu: %d \"", files[i], size, n);
			for (size_t j = 0; j < sizeof(buf) && j < size + 1; j++)
				putchar(buf[j] ? buf[j] : '0');
			printf("\"\n");
		}
	}
	return 0;
}
