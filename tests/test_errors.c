/* SPDX-License-Identifier: MIT */
/*
 * test_errors.c - every TW_E* code has its own name and message, 0 and
 * unknown values have theirs, and the codes are -errno of the same name.
 */
#include <errno.h>
#include <string.h>

#include "test.h"
#include "twheel/wheel.h"

static const struct {
    int code, errnum;
    const char *name;
} codes[] = {
    {TW_EINVAL, EINVAL, "TW_EINVAL"},
    {TW_ENOMEM, ENOMEM, "TW_ENOMEM"},
    {TW_EAGAIN, EAGAIN, "TW_EAGAIN"},
    {TW_EBUSY, EBUSY, "TW_EBUSY"},
    {TW_ESHUTDOWN, ESHUTDOWN, "TW_ESHUTDOWN"},
    {TW_EDEADLK, EDEADLK, "TW_EDEADLK"},
    {TW_ENOENT, ENOENT, "TW_ENOENT"},
    {TW_EEXIST, EEXIST, "TW_EEXIST"},
    {TW_EIO, EIO, "TW_EIO"},
    {TW_ENOSPC, ENOSPC, "TW_ENOSPC"},
    {TW_ECONN, ENOTCONN, "TW_ECONN"},
    /* The durable store's file system errors. */
    {TW_EACCES, EACCES, "TW_EACCES"},
    {TW_EROFS, EROFS, "TW_EROFS"},
    {TW_ENOTDIR, ENOTDIR, "TW_ENOTDIR"},
    /* Remote stores. */
    {TW_EAUTH, EKEYREJECTED, "TW_EAUTH"},
    /* Conditional writes. */
    {TW_ESTALE, ESTALE, "TW_ESTALE"},
};
#define NCODES (sizeof(codes) / sizeof(codes[0]))

static void test_names_and_messages(void)
{
    for (size_t i = 0; i < NCODES; i++) {
        ASSERT_EQ(codes[i].code, -codes[i].errnum);
        ASSERT_STR_EQ(tw_err_name(codes[i].code), codes[i].name);
        const char *msg = tw_strerror(codes[i].code);
        ASSERT_NOT_NULL(msg);
        ASSERT(strcmp(msg, "unknown error") != 0);
        for (size_t j = 0; j < i; j++)
            ASSERT(strcmp(msg, tw_strerror(codes[j].code)) != 0);
    }
    ASSERT_STR_EQ(tw_err_name(0), "0");
    ASSERT_STR_EQ(tw_strerror(0), "success");
    ASSERT_STR_EQ(tw_err_name(-12345), "unknown");
    ASSERT_STR_EQ(tw_strerror(-12345), "unknown error");
    ASSERT_STR_EQ(tw_err_name(1), "unknown");
    /* TW_EAGAIN is more than max_pending: its message says so. */
    ASSERT_NOT_NULL(strstr(tw_strerror(TW_EAGAIN), "max_callbacks"));
    ASSERT_NOT_NULL(strstr(tw_strerror(TW_EAGAIN), "thread"));
}

int main(void)
{
    RUN_TEST(test_names_and_messages);
    return 0;
}
